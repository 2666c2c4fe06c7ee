"""The chat template: messages -> one prompt string.

The shipped models have no chat template of their own, so the server renders each message with a
per-role format (`{content}` is replaced by the message text) and ends with the generation prompt;
`server.chat_template` in the config replaces any of these, and its `stop` strings end the
assistant's turn (added to the request's own).
"""

from dataclasses import dataclass

from eyas.engine.errors import ConfigError

ROLES = ("system", "user", "assistant")


@dataclass
class ChatTemplate:
    """Built from `server.chat_template` (defaults in conf/server/default.yaml)."""

    system: str  # e.g. "System: {content}\n"
    user: str
    assistant: str
    generation_prompt: str  # e.g. "Assistant:"
    stop: list[str]

    def __post_init__(self):
        for role in ROLES:
            if "{content}" not in getattr(self, role):
                raise ConfigError(f"server.chat_template.{role} must contain '{{content}}', got {getattr(self, role)!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError(f"server.chat_template.stop must be a list of non-empty strings, got {self.stop!r}")

    def render(self, messages: list[tuple[str, str]]) -> str:
        """messages: (role, text) pairs, roles among ROLES."""
        return "".join(getattr(self, role).replace("{content}", text) for role, text in messages) + self.generation_prompt
