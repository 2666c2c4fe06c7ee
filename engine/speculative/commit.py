"""Commit: the accepted path of each request becomes its committed positions.

A request's accepted path of m nodes (root first) was verified at columns L + path[i]; its target KV
belongs at columns L + i. A chain's path is 0, 1, ..., so its KV is already in place; a tree's path
may skip columns, and those nodes' KV is moved (every layer; gather, then scatter, so overlapping
moves are safe). The committed length grows by m. KV at every other verified column is dead: it is
overwritten by the next verify and never read before (attention reads below the committed length).
"""

import torch

from eyas.engine.cache.kv_pool import PagedKVPool
from eyas.engine.request import Request
from eyas.engine.speculative.verify import Verified


def commit(requests: list[Request], verified: Verified, is_chain: bool, kv_pool: PagedKVPool,
           req_to_token: torch.Tensor) -> None:
    if not is_chain:
        _move_path_kv(requests, verified, kv_pool, req_to_token)
    for request, tokens in zip(requests, verified.emitted):
        request.num_computed += len(tokens)


def _move_path_kv(requests: list[Request], verified: Verified, kv_pool: PagedKVPool, req_to_token: torch.Tensor) -> None:
    path, on_path = verified.path, verified.on_path  # [B, N]
    columns = torch.arange(path.shape[1], device=path.device)
    moved = on_path & (path != columns)  # [B, N]
    if not bool(moved.any()):
        return
    rows = torch.tensor([r.row for r in requests], dtype=torch.int64, device=path.device)
    prefix = torch.tensor(verified.prefix_lens, dtype=torch.int64, device=path.device)
    table_rows = rows[:, None].expand_as(path)[moved]
    src = req_to_token[table_rows, (prefix[:, None] + path)[moved]]
    dst = req_to_token[table_rows, (prefix[:, None] + columns)[moved]]
    for layer in range(kv_pool.num_layers):  # reads happen before writes: overlapping moves are safe
        kv_pool.k[layer][dst] = kv_pool.k[layer][src]
        kv_pool.v[layer][dst] = kv_pool.v[layer][src]
