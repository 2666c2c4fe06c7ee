"""Page allocator with exact accounting: every page is either free or owned by exactly one request.

Pages are handed out lowest-numbered first, so a request admitted into a pool that is not fragmented
gets one contiguous run of slots (attention then reads its KV as a view instead of a gather).
"""

from eyas.engine.errors import EyasError


class PageAllocator:
    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))  # kept sorted descending: pop() hands out the lowest
        self._owned: set[int] = set()

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    def can_allocate(self, num_pages: int) -> bool:
        return num_pages <= len(self._free)

    def allocate(self, num_pages: int) -> list[int]:
        if not self.can_allocate(num_pages):
            raise EyasError(f"KV pool exhausted: asked {num_pages} pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(num_pages)]
        self._owned.update(pages)
        return pages

    def free(self, pages: list[int]) -> None:
        for page in pages:
            if page not in self._owned:
                raise EyasError(f"page {page} freed twice or never allocated")
            self._owned.remove(page)
            self._free.append(page)
        self._free.sort(reverse=True)
