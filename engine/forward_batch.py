"""What one model forward needs: the packed new tokens of every request and where their KV goes."""

from dataclasses import dataclass, field
from itertools import accumulate

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
    rows: list[int] | None = None  # `req_rows` on the host
    # tree attention: per-request row-major [E, E] blocks, packed flat (query j sees new token i);
    # None: causal over the new tokens. Every request sees its whole prefix either way.
    custom_mask: torch.Tensor | None = None
    # exact: every position computed bit for bit as a one-token decode of it would be (batch-invariant
    # attention, row-invariant GEMMs; eager): the forwards of requests that ask for logprobs
    exact: bool = False
    # bound by the runner just before the forward
    kv_pool: object = field(default=None, repr=False)
    attn_backend: object = field(default=None, repr=False)
    _last_token_indices: torch.Tensor | None = field(default=None, repr=False)

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens)

    @property
    def seq_lens(self) -> list[int]:
        return [p + e for p, e in zip(self.prefix_lens, self.extend_lens)]

    @property
    def max_position(self) -> int:
        return max(p + e for p, e in zip(self.prefix_lens, self.extend_lens)) - 1

    @property
    def last_token_indices(self) -> torch.Tensor:
        # [B] row of each request's last new token in the packed layout
        if self._last_token_indices is None:
            ends = [end - 1 for end in accumulate(self.extend_lens)]
            self._last_token_indices = torch.tensor(ends, dtype=torch.int64, device=self.input_ids.device)
        return self._last_token_indices

    @classmethod
    def from_tails(cls, rows: list[int], token_tails: list[list[int]] | torch.Tensor, prefix_lens: list[int],
                   req_to_token: torch.Tensor) -> "ForwardBatch":
        """Batch that extends request `rows[i]` by `token_tails[i]` after its `prefix_lens[i]` committed tokens.
        `token_tails` is a list of token lists, or a tensor [B, w] when every request extends by w tokens
        (then the ids stay on the device)."""
        device = req_to_token.device
        if isinstance(token_tails, torch.Tensor):
            extend_lens = [token_tails.shape[1]] * token_tails.shape[0]
            input_ids = token_tails.reshape(-1)
        else:
            extend_lens = [len(t) for t in token_tails]
            input_ids = torch.tensor([t for tail in token_tails for t in tail], dtype=torch.int64, device=device)
        # one host-to-device copy: each new token's position and its flat index into the table
        width = req_to_token.shape[1]
        positions = [p + j for p, e in zip(prefix_lens, extend_lens) for j in range(e)]
        flat = [r * width + p + j for r, p, e in zip(rows, prefix_lens, extend_lens) for j in range(e)]
        index = torch.tensor([positions, flat], dtype=torch.int64).to(device, non_blocking=True)  # [2, N]
        out_cache_loc = req_to_token.reshape(-1).index_select(0, index[1])  # a view of the (contiguous) table
        row_t = torch.tensor(rows, dtype=torch.int64, device=device)
        return cls(input_ids, index[0], row_t, list(prefix_lens), extend_lens, out_cache_loc, req_to_token,
                   list(rows))

    @classmethod
    def for_tree(cls, rows: list[int], tokens: torch.Tensor, prefix_lens: list[int], positions: torch.Tensor,
                 mask: torch.Tensor, req_to_token: torch.Tensor) -> "ForwardBatch":
        """Batch of draft-tree nodes: request `rows[i]` extends by tokens[i] ([B, n], same n for all),
        node j written at column prefix_lens[i] + j of its row, at RoPE position positions[i, j], and
        seeing its prefix plus the new tokens mask[i, j] allows ([B, n, n] bool)."""
        device = req_to_token.device
        b, n = tokens.shape
        prefix = torch.tensor(prefix_lens, dtype=torch.int64, device=device)
        row_t = torch.tensor(rows, dtype=torch.int64, device=device)
        columns = prefix[:, None] + torch.arange(n, device=device)  # [B, n]
        out_cache_loc = req_to_token[row_t[:, None], columns].reshape(-1)
        return cls(tokens.reshape(-1), positions.reshape(-1), row_t, list(prefix_lens), [n] * b, out_cache_loc,
                   req_to_token, list(rows), custom_mask=mask.reshape(-1).contiguous())


def wants_exact(requests) -> bool:
    """A target forward over these requests runs `exact` when any of them asks for logprobs: its logprobs
    are then plain decoding's bit for bit, under speculation too."""
    return any(r.params.logprobs is not None for r in requests)
