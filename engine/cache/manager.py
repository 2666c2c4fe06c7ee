"""KV accounting for requests: pages from the allocator (or shared from the prefix cache), slots
written into the request table.

A request holds pages for the positions it has reached plus the positions one step may write
(`grow`), and gets more as it grows. With a prefix cache, a request is admitted onto the cached pages
of the longest prefix it shares with earlier sequences (held by reference, never written), its full
pages join the cache as their KV becomes final (`cache`), and when it ends (`release`) the pages the
cache does not already hold join it while the rest go back to the allocator. Unreferenced cached pages
are evicted, least recently used first, whenever the allocator runs short: before anyone is preempted.
A row whose KV is a copy of another's (the other samples of a prompt: `shared_prefill`) gives its
copied pages back as the original's join the cache, and holds those instead.
Every KV pool of the engine (target, draft) shares these slot indices.
"""

import math
from dataclasses import dataclass, field

import torch

from eyas.engine.cache.allocator import PageAllocator
from eyas.engine.cache.prefix_cache import PrefixCache, PrefixNode
from eyas.engine.cache.req_to_token import ReqToTokenTable


@dataclass
class _RowPages:
    pages: list[int] = field(default_factory=list)  # every page of the row, in position order
    nodes: list[PrefixNode] = field(default_factory=list)  # the cached ones it holds: its first len(nodes) pages
    frozen: bool = False  # a page of it was cached by another request first: cache no more until release
    copies: dict[int, int] = field(default_factory=dict)  # page index -> the page its KV was copied from


class KVCacheManager:
    def __init__(self, allocator: PageAllocator, table: ReqToTokenTable, page_size: int,
                 prefix_cache: PrefixCache | None = None):
        self.allocator = allocator
        self.table = table
        self.page_size = page_size
        self.prefix_cache = prefix_cache  # None: no prefix caching
        self._rows: dict[int, _RowPages] = {}  # table row -> its pages

    @property
    def max_context_len(self) -> int:
        """The longest sequence a request may reach (speculation's lookahead not included)."""
        return self.table.max_context_len

    @property
    def capacity_tokens(self) -> int:
        return self.allocator.num_pages * self.page_size

    @property
    def cached_pages(self) -> int:
        return 0 if self.prefix_cache is None else self.prefix_cache.num_pages

    @property
    def used_pages(self) -> int:
        """Pages requests hold (cached pages no request holds are not counted: they are free to evict)."""
        evictable = 0 if self.prefix_cache is None else self.prefix_cache.num_evictable
        return self.allocator.num_pages - self.allocator.num_free_pages - evictable

    def pages_for(self, num_tokens: int) -> int:
        """Pages for positions 0..num_tokens-1, at most the table's width (context plus lookahead)."""
        return math.ceil(min(num_tokens, self.table.width) / self.page_size)

    def match(self, tokens: list[int]) -> list[PrefixNode]:
        """Cached pages of the longest prefix of `tokens` (at least its last token left to compute)."""
        return [] if self.prefix_cache is None else self.prefix_cache.match(tokens)

    def can_admit(self, num_tokens: int, matched: list[PrefixNode] = ()) -> bool:
        missing = self.pages_for(num_tokens) - len(matched)
        return self.table.num_free_rows > 0 and missing <= self._obtainable(matched)

    def admit(self, num_tokens: int, matched: list[PrefixNode] = ()) -> int:
        """Take a table row holding the `matched` cached pages and KV for `num_tokens` positions; return the row."""
        row = self.table.allocate_row()
        pages = _RowPages()
        self._rows[row] = pages
        if matched:
            self.prefix_cache.acquire(matched)
            pages.nodes = list(matched)
            self._assign(row, pages, [n.page for n in matched])
        if not self.grow(row, num_tokens):
            raise AssertionError("admit() after can_admit() found the pool short")
        return row

    def grow(self, row: int, num_tokens: int) -> bool:
        """Make positions 0..num_tokens-1 of `row` hold slots; False (nothing taken) when the pool is short
        even after evicting every unreferenced cached page."""
        pages = self._rows[row]
        missing = self.pages_for(num_tokens) - len(pages.pages)
        if missing <= 0:
            return True
        if missing > self._obtainable():
            return False
        short = missing - self.allocator.num_free_pages
        if short > 0:
            self.prefix_cache.evict(short)
        self._assign(row, pages, self.allocator.allocate(missing))
        return True

    def caches_more(self, row: int, num_tokens: int, valid_len: int) -> bool:
        """Whether `cache` would find a page of the row to cache (a check that needs no token list)."""
        pages = self._rows[row]
        return (self.prefix_cache is not None and not pages.frozen
                and self.prefix_cache.full_pages(num_tokens, valid_len) > len(pages.nodes))

    def cache(self, row: int, tokens: list[int], valid_len: int) -> None:
        """Cache the row's full pages whose KV is final: positions below `valid_len` of `tokens`, the
        sequence of the row. The row goes on holding them (by reference)."""
        if self.prefix_cache is None:
            return
        pages, cache = self._rows[row], self.prefix_cache
        if pages.frozen:
            return
        parent = pages.nodes[-1] if pages.nodes else cache.root
        for index in range(len(pages.nodes), cache.full_pages(len(tokens), valid_len)):
            key = cache.key(tokens, index)
            node = parent.children.get(key)
            if node is not None and pages.copies.get(index) == node.page:  # ours is a copy of it: hold it instead
                cache.acquire([node])
                self.allocator.free([pages.pages[index]])
                self._point(row, pages, index, node.page)
            elif node is not None:  # another request cached this page first: keep ours private
                pages.frozen = True
                return
            else:
                node = cache.insert(parent, key, pages.pages[index], refs=1)
            parent = node
            pages.nodes.append(node)

    def note_copy(self, row: int, source_row: int, end: int) -> None:
        """The row's positions from the end of its cached pages to `end` hold a copy of `source_row`'s KV
        there; its whole pages among them may later be exchanged for the source's (see `cache`)."""
        pages, source = self._rows[row], self._rows[source_row]
        pages.copies = {i: source.pages[i] for i in range(len(pages.nodes), end // self.page_size)}

    def release(self, row: int, tokens: list[int] | None = None, valid_len: int = 0) -> None:
        """Give the row back. With `tokens` (its sequence, KV final below `valid_len`), its full pages
        the cache lacks join the cache; the others are freed."""
        pages = self._rows.pop(row)
        keep = len(pages.nodes)  # pages[:keep] stay with the cache
        cache = self.prefix_cache
        free = []
        if cache is not None and tokens is not None:
            parent = pages.nodes[-1] if pages.nodes else cache.root
            for index in range(len(pages.nodes), cache.full_pages(len(tokens), valid_len)):
                key = cache.key(tokens, index)
                page = pages.pages[index]
                if key in parent.children:  # cached already (by another request): ours is a duplicate
                    parent = parent.children[key]
                    free.append(page)
                else:
                    parent = cache.insert(parent, key, page, refs=0)
                keep = index + 1
        if cache is not None:
            cache.release(pages.nodes)
        self.allocator.free(free + pages.pages[keep:])
        self.table.free_row(row)

    def clear_cache(self) -> int:
        """Evict every cached page no request holds; the count freed."""
        return 0 if self.prefix_cache is None else self.prefix_cache.clear()

    def all_free(self) -> bool:
        """No request holds anything: every page is free or cached and unreferenced."""
        cached = self.cached_pages
        unreferenced = cached == (0 if self.prefix_cache is None else self.prefix_cache.num_evictable)
        return (not self._rows and unreferenced and self.allocator.num_free_pages + cached == self.allocator.num_pages
                and self.table.num_free_rows == self.table.max_requests)

    def _obtainable(self, taking: list[PrefixNode] = ()) -> int:
        """Pages the allocator can hand out after evicting what may be evicted (not the cached pages
        about to be taken)."""
        if self.prefix_cache is None:
            return self.allocator.num_free_pages
        return (self.allocator.num_free_pages + self.prefix_cache.num_evictable
                - self.prefix_cache.unreferenced(taking))

    def _point(self, row: int, pages: _RowPages, index: int, page: int) -> None:
        """Make page `index` of the row `page`: its slots fill the table's columns of that page."""
        pages.pages[index] = page
        first = index * self.page_size
        n = min(self.page_size, self.table.width - first)
        self.table.table[row, first:first + n] = torch.arange(page * self.page_size, page * self.page_size + n,
                                                              device=self.table.table.device)

    def _assign(self, row: int, pages: _RowPages, new_pages: list[int]) -> None:
        """Append `new_pages` to the row: their slots fill the table's next columns."""
        first = len(pages.pages) * self.page_size
        pages.pages.extend(new_pages)
        page_ids = torch.tensor(new_pages, dtype=torch.int64)
        slots = (page_ids[:, None] * self.page_size + torch.arange(self.page_size)[None, :]).flatten()
        n = min(slots.numel(), self.table.width - first)
        self.table.table[row, first:first + n] = slots[:n].to(self.table.table.device)
