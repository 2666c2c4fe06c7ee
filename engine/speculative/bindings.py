"""The one place where speculative bindings are set.

Invariant (the contract this engine is built around): the draft-extend forward initialises its
metadata through `draft_runner.attn_backend`, so whenever a draft-extend backend exists,
`draft_runner.attn_backend` IS that backend. A None draft-extend backend never replaces a live one.
Initialisation and every runtime-state switch go through `bind_runtime_state`; restoring a snapshot
goes through `restore_bindings`; both assign through `_assign`, and nothing else assigns these
attributes.
"""

BINDINGS = ("state", "num_steps", "draft.num_steps", "draft.draft_decode_backend", "draft.draft_extend_backend",
            "draft.draft_runner.attn_backend", "draft.mode", "verify_backend", "verify_buffers")


def binding_names(worker) -> tuple[str, ...]:
    """The bindings of `worker`: a drafter without a draft model (n-gram) has no draft runner, and only a
    drafter that switches between drafters (the hybrid) has a mode."""
    names = BINDINGS
    if getattr(worker.drafter, "draft_runner", None) is None:
        names = tuple(name for name in names if not name.startswith("draft.draft_runner."))
    if not hasattr(worker.drafter, "configured_mode"):
        names = tuple(name for name in names if name != "draft.mode")
    return names


def bind_runtime_state(worker, state) -> None:
    """Point `worker` (a SpeculativeWorker) and its drafter at everything `state` holds."""
    draft = worker.drafter
    extend = state.draft_extend_backend
    runner = getattr(draft, "draft_runner", None)
    if state.drafter is not None and not hasattr(draft, "configured_mode"):
        raise ValueError(f"a runtime state for the {state.drafter!r} drafter needs a drafter that switches "
                         f"between drafters, got {type(draft).__name__}")
    bindings = {
        "state": state,
        "num_steps": state.num_steps,
        "draft.num_steps": state.num_steps,
        "draft.draft_decode_backend": state.draft_decode_backend,
        "draft.draft_extend_backend": extend if extend is not None else draft.draft_extend_backend,
        "draft.draft_runner.attn_backend": extend if extend is not None else getattr(runner, "attn_backend", None),
        "draft.mode": state.drafter or getattr(draft, "configured_mode", None),
        "verify_backend": state.verify_backend,
        "verify_buffers": state.verify_buffers,
    }
    names = binding_names(worker)
    _assign(worker, {name: value for name, value in bindings.items() if name in names})


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
        owner = getattr(owner, "drafter" if part == "draft" else part)
    return owner, attr
