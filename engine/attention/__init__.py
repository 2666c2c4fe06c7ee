"""Attention backends (`registry.BACKENDS` by name).

A backend is bound to a model runner (`runner.attn_backend`) and has a `name`. Before each forward
the runner calls `init_forward_metadata(batch)` on it, which prepares per-batch state on the backend
itself; each attention layer then calls `forward(q, k, v, layer_id, batch)` (q: [N, Hq, D], k/v:
[N, Hkv, D] for the new tokens -> [N, Hq, D]), which stores the new K/V into the pool and attends over
the request's committed prefix plus the new tokens. Because the metadata lives on the backend, the
backend a runner is bound to decides how its forward runs.
"""
