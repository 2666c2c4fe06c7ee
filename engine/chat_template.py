"""The chat template: messages -> one prompt string.

A checkpoint with a chat template of its own (`chat_template` in tokenizer_config.json, or a GGUF file's
`tokenizer.chat_template`) is rendered with it (`ModelChatTemplate`); the others render each message with
a per-role format (`{content}` is replaced by the message text) and end with the generation prompt;
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
    from_model: bool = True  # a checkpoint's own template (`ModelChatTemplate`) replaces these formats

    def __post_init__(self):
        for role in ROLES:
            if "{content}" not in getattr(self, role):
                raise ConfigError(f"server.chat_template.{role} must contain '{{content}}', got {getattr(self, role)!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError(f"server.chat_template.stop must be a list of non-empty strings, got {self.stop!r}")

    def render(self, messages: list[tuple[str, str]]) -> str:
        """messages: (role, text) pairs, roles among ROLES."""
        return "".join(getattr(self, role).replace("{content}", text) for role, text in messages) + self.generation_prompt


class ChatTemplateError(ValueError):
    """The checkpoint's chat template refused a conversation (its own `raise_exception`, or an error rendering it)."""


class ModelChatTemplate:
    """A checkpoint's own chat template (`chat_template` of its tokenizer_config.json, or a GGUF file's
    `tokenizer.chat_template`): Jinja rendered as transformers' `apply_chat_template` renders it (a
    sandboxed environment, trim_blocks and lstrip_blocks, `raise_exception` and `strftime_now`)."""

    def __init__(self, source: str, bos_token: str | None = None, eos_token: str | None = None):
        from datetime import datetime

        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ConfigError(f"the checkpoint's chat_template is not a valid Jinja template: {e}") from e
        self.bos_token, self.eos_token = bos_token or "", eos_token or ""
        # no stop strings: the turn ends at the template's end-of-turn token, which the engine stops on as its eos
        self.stop: list[str] = []

    def render(self, messages: list[tuple[str, str]]) -> str:
        """messages: (role, text) pairs; ends with the assistant's generation prompt."""
        import jinja2

        try:
            return self._template.render(messages=[{"role": r, "content": t} for r, t in messages],
                                         add_generation_prompt=True, bos_token=self.bos_token,
                                         eos_token=self.eos_token, tools=None)
        except jinja2.exceptions.TemplateError as e:  # raise_exception() in the template: messages it refuses
            raise ChatTemplateError(f"the checkpoint's chat_template refused these messages: {e}") from e


def model_chat_template(checkpoint_dir) -> ModelChatTemplate | None:
    """The checkpoint's own chat template, or None when its tokenizer_config.json has none."""
    import json
    from pathlib import Path

    config_file = Path(checkpoint_dir) / "tokenizer_config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    if not isinstance(source, str) or not source:
        return None

    def token(value):
        return value.get("content") if isinstance(value, dict) else value

    return ModelChatTemplate(source, token(config.get("bos_token")), token(config.get("eos_token")))
