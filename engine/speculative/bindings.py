"""The one place where speculative backend bindings are set.

Invariant (the contract this engine is built around): the draft-extend forward initialises its
metadata through `draft_runner.attn_backend`, so whenever a draft-extend backend exists,
`draft_runner.attn_backend` IS that backend. A None draft-extend backend never replaces a live one.
Initialisation and every runtime-state switch go through `bind_draft_backends`; nothing else assigns
these attributes.
"""


def bind_draft_backends(draft_worker, decode_backend, extend_backend) -> None:
    draft_worker.draft_decode_backend = decode_backend
    if extend_backend is not None:
        draft_worker.draft_extend_backend = extend_backend
        draft_worker.draft_runner.attn_backend = extend_backend


def draft_bindings(draft_worker) -> dict:
    """A snapshot of every live draft binding (compared with `is` by the contract tests)."""
    return {
        "draft_decode_backend": draft_worker.draft_decode_backend,
        "draft_extend_backend": draft_worker.draft_extend_backend,
        "draft_runner.attn_backend": draft_worker.draft_runner.attn_backend,
    }
