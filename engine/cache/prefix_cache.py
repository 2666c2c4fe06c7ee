"""Prefix cache: full KV pages of earlier sequences, kept in a trie of pages and shared by reference.

A node is one full page: the KV of `page_size` positions of every pool (target and draft) that share
the slot indices. Its edge is keyed by the page's tokens *and the token after them*: an EAGLE head's
KV at position p pairs the target's feature at p with token p + 1, so a page's draft KV is only what a
new request would compute when the token after the page matches too. Keying by that token makes the
target's and the draft's cached KV valid together, with no hidden state kept at the boundary: the
request computes from the first position past the match, and so does its head. Keys are compared
exactly (dict keys are token tuples, walked from the root), so no hash collision can hand a request
another's KV.

Pages, not a token-granular radix tree: the pool's unit of allocation is the page, and a partial page
would need copy-on-write before its owner or a sharer writes its other slots. With `page_size = 1`
every token is its own node.

A request holding a cached page holds every page on the way to it (it matched them in order), so a
node's reference count is at least each child's: unreferenced nodes form whole subtrees, all of them
evictable, leaves first in least-recently-used order.
"""

import heapq
import itertools

from eyas.engine.cache.allocator import PageAllocator


class PrefixNode:
    __slots__ = ("key", "page", "parent", "children", "refs", "last_used")

    def __init__(self, key: tuple | None, page: int, parent: "PrefixNode | None"):
        self.key = key  # the page's tokens + the token after them
        self.page = page
        self.parent = parent
        self.children: dict[tuple, PrefixNode] = {}
        self.refs = 0  # requests whose table row holds this page
        self.last_used = 0


class PrefixCache:
    def __init__(self, allocator: PageAllocator, page_size: int):
        self.allocator = allocator
        self.page_size = page_size
        self.root = PrefixNode(None, -1, None)
        self.num_pages = 0  # pages in the trie
        self.num_evictable = 0  # of them, unreferenced
        self._clock = itertools.count(1)
        self._leaves: list[tuple[int, int, PrefixNode]] = []  # heap of (last_used, tiebreak, node); stale entries skipped
        self._tiebreak = itertools.count()

    def key(self, tokens: list[int], index: int) -> tuple:
        """The edge key of page `index` of a sequence: its tokens and the one after them."""
        start = index * self.page_size
        return tuple(tokens[start:start + self.page_size + 1])

    def full_pages(self, num_tokens: int, valid_len: int) -> int:
        """Pages of a sequence of `num_tokens` tokens that can be cached when positions below `valid_len`
        hold their KV: each whole page below valid_len whose next token is known."""
        return min(valid_len, num_tokens - 1) // self.page_size

    def match(self, tokens: list[int]) -> list[PrefixNode]:
        """The cached pages of the longest prefix of `tokens`, leaving at least its last token to compute."""
        nodes, node = [], self.root
        for index in range(self.full_pages(len(tokens), len(tokens) - 1)):
            node = node.children.get(self.key(tokens, index))
            if node is None:
                break
            nodes.append(node)
        return nodes

    def acquire(self, nodes: list[PrefixNode]) -> None:
        now = next(self._clock)
        for node in nodes:
            if node.refs == 0:
                self.num_evictable -= 1
            node.refs += 1
            node.last_used = now

    def release(self, nodes: list[PrefixNode]) -> None:
        now = next(self._clock)
        for node in reversed(nodes):  # deepest first: a node becomes a leaf once its children are evictable
            node.refs -= 1
            node.last_used = now
            if node.refs == 0:
                self.num_evictable += 1
                self._push_if_leaf(node)

    def insert(self, parent: PrefixNode, key: tuple, page: int, refs: int) -> PrefixNode:
        """Cache `page` under `parent` (which holds no child of this key); `refs`: its holders now (0 or 1)."""
        node = PrefixNode(key, page, parent)
        node.refs = refs
        node.last_used = next(self._clock)
        parent.children[key] = node
        self.num_pages += 1
        if refs == 0:
            self.num_evictable += 1
            self._push_if_leaf(node)
        return node

    def unreferenced(self, nodes: list[PrefixNode]) -> int:
        """How many of `nodes` no request holds (evictable now, not once a request takes them)."""
        return sum(node.refs == 0 for node in nodes)

    def evict(self, num_pages: int) -> int:
        """Free up to `num_pages` unreferenced pages, least recently used leaves first; the count freed."""
        freed = []
        while len(freed) < num_pages and self._leaves:
            used, _, node = heapq.heappop(self._leaves)
            if used != node.last_used or node.refs or node.children or node.parent is None:
                continue  # stale: taken again since, grew a child, or already evicted
            del node.parent.children[node.key]
            freed.append(node.page)
            self.num_pages -= 1
            self.num_evictable -= 1
            parent, node.parent = node.parent, None
            if parent is not self.root and parent.refs == 0:
                self._push_if_leaf(parent)
        self.allocator.free(freed)
        return len(freed)

    def clear(self) -> int:
        """Evict every unreferenced page; the count freed."""
        return self.evict(self.num_evictable)

    def _push_if_leaf(self, node: PrefixNode) -> None:
        if not node.children:
            heapq.heappush(self._leaves, (node.last_used, next(self._tiebreak), node))
            if len(self._leaves) > 4 * self.num_pages + 64:  # drop stale entries now and then
                self._leaves = [e for e in self._leaves
                                if e[0] == e[2].last_used and not e[2].refs and not e[2].children and e[2].parent]
                heapq.heapify(self._leaves)
