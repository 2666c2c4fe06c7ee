"""The OpenAI-compatible server: request models, the engine loop, metrics and the HTTP app."""
