"""KV accounting for requests: pages from the allocator, slots written into the request table.

A request reserves, at admission, the pages for its longest possible sequence (prompt + new tokens +
lookahead), so an admitted request never runs out of KV; it releases them the moment it finishes.
Every KV pool of the engine (target, draft) shares these slot indices.
"""

import math

import torch

from engine.cache.allocator import PageAllocator
from engine.cache.req_to_token import ReqToTokenTable


class KVCacheManager:
    def __init__(self, allocator: PageAllocator, table: ReqToTokenTable, page_size: int):
        self.allocator = allocator
        self.table = table
        self.page_size = page_size
        self._pages: dict[int, list[int]] = {}  # table row -> owned pages

    @property
    def max_context_len(self) -> int:
        return self.table.max_context_len

    @property
    def capacity_tokens(self) -> int:
        return self.allocator.num_pages * self.page_size

    def pages_for(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.page_size)

    def can_admit(self, num_tokens: int) -> bool:
        return self.table.num_free_rows > 0 and self.allocator.can_allocate(self.pages_for(num_tokens))

    def admit(self, num_tokens: int) -> int:
        """Reserve KV for `num_tokens` positions; return the request's table row."""
        pages = self.allocator.allocate(self.pages_for(num_tokens))
        row = self.table.allocate_row()
        self._pages[row] = pages
        page_ids = torch.tensor(pages, dtype=torch.int64)
        slots = (page_ids[:, None] * self.page_size + torch.arange(self.page_size)[None, :]).flatten()
        n = min(slots.numel(), self.table.max_context_len)
        self.table.table[row, :n] = slots[:n].to(self.table.table.device)
        return row

    def release(self, row: int) -> None:
        self.allocator.free(self._pages.pop(row))
        self.table.free_row(row)

    def all_free(self) -> bool:
        return (not self._pages and self.allocator.num_free_pages == self.allocator.num_pages
                and self.table.num_free_rows == self.table.max_requests)
