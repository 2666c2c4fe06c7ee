"""Structured output: a grammar (JSON schema, any JSON object, a regex, a Lark grammar) masks the
target's tokens at every position, in plain decoding and at every node a verify scores."""
