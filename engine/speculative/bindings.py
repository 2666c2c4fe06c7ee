"""The one place where speculative bindings are set.

Invariant (the contract this engine is built around): the draft-extend forward initialises its
metadata through the head runner's `attn_backend`, so whenever a draft-extend backend exists, the
runner's `attn_backend` IS that backend. A None draft-extend backend never replaces a live one.
Initialisation and every runtime-state switch go through `bind_runtime_state`; restoring a snapshot
goes through `restore_bindings`; both assign through `_assign`, and nothing else assigns these
attributes. Everything else a runtime state holds is read from the live state (`worker.state`).
"""

BINDINGS = ("state", "drafter.head.draft_extend_backend", "drafter.head.runner.attn_backend")


def binding_names(worker) -> tuple[str, ...]:
    """The bindings of `worker`: a drafter without a draft model (n-gram) has no head to bind."""
    if worker.drafter.head is None:
        return tuple(name for name in BINDINGS if not name.startswith("drafter.head."))
    return BINDINGS


def bind_runtime_state(worker, state) -> None:
    """Point `worker` (a SpeculativeWorker) and its drafter's head at everything `state` holds."""
    bindings = {"state": state}
    head = worker.drafter.head
    if head is not None and state.draft_extend_backend is not None:
        bindings["drafter.head.draft_extend_backend"] = state.draft_extend_backend
        bindings["drafter.head.runner.attn_backend"] = state.draft_extend_backend
    _assign(worker, bindings)


def snapshot_bindings(worker) -> dict:
    """Every live binding by name (compared with `is` by the contract tests)."""
    return {name: _get(worker, name) for name in binding_names(worker)}


def restore_bindings(worker, snapshot: dict) -> None:
    _assign(worker, snapshot)


def _assign(worker, bindings: dict) -> None:
    for name, value in bindings.items():
        owner, attr = _owner(worker, name)
        setattr(owner, attr, value)


def _get(worker, name: str):
    owner, attr = _owner(worker, name)
    return getattr(owner, attr)


def _owner(worker, name: str):
    *path, attr = name.split(".")
    owner = worker
    for part in path:
        owner = getattr(owner, part)
    return owner, attr
