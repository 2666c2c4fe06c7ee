"""What one model forward needs: the packed new tokens of every request and where their KV goes."""

from dataclasses import dataclass, field

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [N] new tokens of all requests, packed
    positions: torch.Tensor  # [N] rope positions
    req_rows: torch.Tensor  # [B] rows of the request-to-token table
    prefix_lens: list[int]  # KV already committed per request (read, not written)
    extend_lens: list[int]  # new tokens per request; sum = N
    out_cache_loc: torch.Tensor  # [N] KV slots the new tokens write (-1 = skip)
    req_to_token: torch.Tensor  # [R, C] the request-to-token table
    # bound by the runner just before the forward
    kv_pool: object = field(default=None, repr=False)
    attn_backend: object = field(default=None, repr=False)

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens)

    @property
    def seq_lens(self) -> list[int]:
        return [p + e for p, e in zip(self.prefix_lens, self.extend_lens)]

    @property
    def last_token_indices(self) -> torch.Tensor:
        # [B] row of each request's last new token in the packed layout
        ends = torch.tensor(self.extend_lens, device=self.input_ids.device).cumsum(0)
        return ends - 1

    @classmethod
    def from_tails(cls, rows: list[int], token_tails: list[list[int]], prefix_lens: list[int],
                   req_to_token: torch.Tensor) -> "ForwardBatch":
        """Batch that extends request `rows[i]` by `token_tails[i]` after its `prefix_lens[i]` committed tokens."""
        device = req_to_token.device
        extend_lens = [len(t) for t in token_tails]
        row_t = torch.tensor(rows, dtype=torch.int64, device=device)
        positions = torch.cat([torch.arange(p, p + e, dtype=torch.int64) for p, e in zip(prefix_lens, extend_lens)])
        positions = positions.to(device)
        row_per_token = torch.repeat_interleave(row_t, torch.tensor(extend_lens, device=device))
        out_cache_loc = req_to_token[row_per_token, positions]
        input_ids = torch.tensor([t for tail in token_tails for t in tail], dtype=torch.int64, device=device)
        return cls(input_ids, positions, row_t, list(prefix_lens), extend_lens, out_cache_loc, req_to_token)
