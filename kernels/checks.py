"""Argument checks shared by the kernel wrappers: a failed check is a ValueError naming the argument."""


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
