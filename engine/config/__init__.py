"""The composed config (a plain dict, checked against `schema`): `resolve` fills in what it derives, `validate`
checks the result; the containers receive it as `schema`'s dataclasses."""

from eyas.engine.config.resolution import resolve
from eyas.engine.config.validation import validate


def prepare(config: dict) -> tuple[dict, list[str]]:
    """A composed config -> (its resolved copy, checked; the notices to show). Raises ConfigError."""
    resolved, notices = resolve(config)
    validate(resolved)
    return resolved, notices


__all__ = ["prepare", "resolve", "validate"]
