"""Request-to-slot table: row `r`, column `p` holds the KV slot of token position `p` of the request in row `r`.

A sequence is at most `max_context_len` tokens long; a speculative step also writes up to
`lookahead_tokens` positions past the committed length (drafts, verify nodes), so the table is
`width = max_context_len + lookahead_tokens` columns wide. Only the layout of slots uses the width:
what fits a request is the context limit alone, whatever the speculation.
"""

import torch

from eyas.engine.errors import EyasError


class ReqToTokenTable:
    def __init__(self, max_requests: int, max_context_len: int, lookahead_tokens: int, device: torch.device):
        self.max_requests = max_requests
        self.max_context_len = max_context_len  # the longest sequence a request may reach
        self.lookahead_tokens = lookahead_tokens  # positions one step may write past the committed length
        self.width = max_context_len + lookahead_tokens
        self.table = torch.full((max_requests, self.width), -1, dtype=torch.int64, device=device)
        self._free_rows = list(range(max_requests - 1, -1, -1))

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def allocate_row(self) -> int:
        if not self._free_rows:
            raise EyasError("request table full")
        return self._free_rows.pop()

    def free_row(self, row: int) -> None:
        if row in self._free_rows:
            raise EyasError(f"request row {row} freed twice")
        self.table[row].fill_(-1)
        self._free_rows.append(row)
