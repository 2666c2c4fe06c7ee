"""KV accounting for requests: pages from the allocator, slots written into the request table.

A request holds pages for the positions it has reached plus the positions one step may write
(`grow`), and gets more as it grows; it releases them all the moment it finishes or is preempted.
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
        self._pages: dict[int, list[int]] = {}  # table row -> owned pages, in position order

    @property
    def max_context_len(self) -> int:
        """The longest sequence a request may reach (speculation's lookahead not included)."""
        return self.table.max_context_len

    @property
    def capacity_tokens(self) -> int:
        return self.allocator.num_pages * self.page_size

    @property
    def used_pages(self) -> int:
        return self.allocator.num_pages - self.allocator.num_free_pages

    def pages_for(self, num_tokens: int) -> int:
        """Pages for positions 0..num_tokens-1, at most the table's width (context plus lookahead)."""
        return math.ceil(min(num_tokens, self.table.width) / self.page_size)

    def can_admit(self, num_tokens: int) -> bool:
        return self.table.num_free_rows > 0 and self.allocator.can_allocate(self.pages_for(num_tokens))

    def admit(self, num_tokens: int) -> int:
        """Take a table row with KV for `num_tokens` positions; return the row."""
        row = self.table.allocate_row()
        self._pages[row] = []
        self.grow(row, num_tokens)
        return row

    def grow(self, row: int, num_tokens: int) -> bool:
        """Make positions 0..num_tokens-1 of `row` hold slots; False (nothing taken) when the pool is short."""
        owned = self._pages[row]
        missing = self.pages_for(num_tokens) - len(owned)
        if missing <= 0:
            return True
        if not self.allocator.can_allocate(missing):
            return False
        pages = self.allocator.allocate(missing)
        first = len(owned) * self.page_size
        owned.extend(pages)
        page_ids = torch.tensor(pages, dtype=torch.int64)
        slots = (page_ids[:, None] * self.page_size + torch.arange(self.page_size)[None, :]).flatten()
        n = min(slots.numel(), self.table.width - first)
        self.table.table[row, first:first + n] = slots[:n].to(self.table.table.device)
        return True

    def release(self, row: int) -> None:
        self.allocator.free(self._pages.pop(row))
        self.table.free_row(row)

    def all_free(self) -> bool:
        return (not self._pages and self.allocator.num_free_pages == self.allocator.num_pages
                and self.table.num_free_rows == self.table.max_requests)
