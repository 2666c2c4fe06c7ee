"""Errors a user can cause. One type per family; messages name the field or file and the allowed values."""


class EyasError(Exception):
    """Base class of every error the engine raises on purpose."""


class ConfigError(EyasError, ValueError):
    """An invalid configuration value or combination (names the field and the allowed values)."""


class CheckpointError(EyasError):
    """A checkpoint directory that cannot be loaded (names the file or tensor)."""


class RequestError(EyasError, ValueError):
    """A request that cannot be served (empty prompt, too long for the context or the KV pool)."""
