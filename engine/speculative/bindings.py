"""The one place where speculative bindings are set.

Invariant (the contract this engine is built around): the draft-extend forward initialises its
metadata through `draft_runner.attn_backend`, so whenever a draft-extend backend exists,
`draft_runner.attn_backend` IS that backend. A None draft-extend backend never replaces a live one.
Initialisation and every runtime-state switch go through `bind_runtime_state`; restoring a snapshot
goes through `restore_bindings`; both assign through `_assign`, and nothing else assigns these
attributes.
"""

BINDINGS = ("state", "num_steps", "draft.num_steps", "draft.draft_decode_backend", "draft.draft_extend_backend",
            "draft.draft_runner.attn_backend", "verify_backend", "verify_buffers")


def bind_runtime_state(worker, state) -> None:
    """Point `worker` (an EagleWorker) and its draft worker at everything `state` holds."""
    draft = worker.draft_worker
    extend = state.draft_extend_backend
    _assign(worker, {
        "state": state,
        "num_steps": state.num_steps,
        "draft.num_steps": state.num_steps,
        "draft.draft_decode_backend": state.draft_decode_backend,
        "draft.draft_extend_backend": extend if extend is not None else draft.draft_extend_backend,
        "draft.draft_runner.attn_backend": extend if extend is not None else draft.draft_runner.attn_backend,
        "verify_backend": state.verify_backend,
        "verify_buffers": state.verify_buffers,
    })


def snapshot_bindings(worker) -> dict:
    """Every live binding by name (compared with `is` by the contract tests)."""
    return {name: _get(worker, name) for name in BINDINGS}


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
        owner = getattr(owner, "draft_worker" if part == "draft" else part)
    return owner, attr
