"""SuffixIndex: the token streams (prompt + output) of live and recent requests, indexed so that any
request's current suffix is found wherever it occurred before, in its own tokens or another's.

Streams are kept whole; every n-gram of length in `key_lengths` that has a token after it maps to
its end positions (stream id and offset packed in one int), oldest first. Appending a token to a
stream indexes the n-grams that now have a continuation, so an update costs len(key_lengths) dict
appends per token, never a rescan (it runs after verify, between steps). A lookup takes the longest
indexed key that matches the request's suffix, then measures each occurrence's whole match by
comparing backwards (up to `max_match` tokens, by halving slice compares); the occurrences of the
longest match are the pattern's, and their continuations, counted by prefix, are the proposal: a
trie scored by how often each continuation followed (SuffixDecoding's rule, over positions rather than
a suffix tree's nodes: one entry per token and key length, where a suffix tree of bounded depth D keeps
up to D nodes per token, and a continuation can run as deep as the stream it reads).

Memory is bounded by `max_tokens`: past it, the oldest finished stream is dropped; its index entries
go lazily (skipped when met, and swept out when they outnumber the live ones).
"""

import heapq
from collections import OrderedDict

SHIFT = 32  # entry = stream id << SHIFT | end offset
MASK = (1 << SHIFT) - 1


class SuffixIndex:
    def __init__(self, key_lengths: range, max_match: int, max_tokens: int, max_occurrences: int):
        self.key_lengths = key_lengths  # n-gram lengths indexed, longest tried first
        self.max_match = max_match  # longest match measured (tokens)
        self.max_tokens = max_tokens  # tokens kept over every stream
        self.max_occurrences = max_occurrences  # newest occurrences of a key examined per lookup
        self.streams: dict[int, list[int]] = {}  # stream id -> its tokens
        self.finished: OrderedDict[int, None] = OrderedDict()  # finished stream ids, oldest first
        self.num_tokens = 0
        self._ends: dict[tuple[int, ...], list[int]] = {}  # key -> entries, oldest first
        self._entries = 0  # entries in `_ends`, dead ones included
        self._dead = 0  # entries of dropped streams not yet swept
        self._next_id = 0

    # streams
    def open(self, tokens: list[int]) -> int:
        """A new stream holding `tokens`; returns its id."""
        sid = self._next_id
        self._next_id += 1
        self.streams[sid] = []
        self.extend(sid, tokens)
        return sid

    def extend(self, sid: int, tokens: list[int]) -> None:
        stream, ends, lengths = self.streams[sid], self._ends, self.key_lengths
        base = sid << SHIFT
        for token in tokens:
            end = len(stream) - 1  # the n-grams ending here now have a continuation: `token`
            stream.append(token)
            for n in lengths:
                if n > end + 1:
                    break
                key = tuple(stream[end - n + 1:end + 1])
                found = ends.get(key)
                if found is None:
                    ends[key] = [base | end]
                else:
                    found.append(base | end)
                self._entries += 1
        self.num_tokens += len(tokens)
        self._evict()

    def finish(self, sid: int) -> None:
        """The stream is complete: it stays indexed until memory asks for its room, oldest first."""
        if sid in self.streams:
            self.finished[sid] = None
        self._evict()

    def _evict(self) -> None:
        while self.num_tokens > self.max_tokens and self.finished:
            sid, _ = self.finished.popitem(last=False)
            stream = self.streams.pop(sid)
            self.num_tokens -= len(stream)
            self._dead += sum(max(len(stream) - n, 0) for n in self.key_lengths)
        if self._dead > 1024 and 2 * self._dead > self._entries:
            self._sweep()

    def _sweep(self) -> None:
        live = self.streams
        swept = {}
        for key, entries in self._ends.items():
            kept = [e for e in entries if (e >> SHIFT) in live]
            if kept:
                swept[key] = kept
        self._ends = swept
        self._entries = sum(map(len, swept.values()))
        self._dead = 0

    # lookup
    def match(self, sid: int) -> tuple[int, list[tuple[list[int], int]]]:
        """The longest earlier match of stream `sid`'s suffix: (its length, its occurrences as (stream,
        offset of the token after the match), newest first); (0, []) when no key matches."""
        ctx = self.streams[sid]
        size = len(ctx)
        for n in reversed(self.key_lengths):
            if n > size:
                continue
            entries = self._ends.get(tuple(ctx[size - n:]))
            if not entries:
                continue
            best, found = 0, []
            for entry in reversed(entries[-self.max_occurrences:]):
                stream = self.streams.get(entry >> SHIFT)
                if stream is None:
                    continue
                end = entry & MASK
                length = _match_length(stream, end, ctx, n, self.max_match)
                if length > best:
                    best, found = length, [(stream, end + 1)]
                elif length == best:
                    found.append((stream, end + 1))
            if found:
                return best, found
        return 0, []

    def continuations(self, sid: int, max_depth: int, max_children: int, max_nodes: int,
                      min_prob: float, factor: float) -> tuple[int, list[list[int]]]:
        """(match length, paths): the continuations of stream `sid`'s longest match, as root-to-node
        paths of the nodes kept, best first. Depth is at most min(max_depth, factor x match length);
        a node is kept when the fraction of the occurrences that reach it is at least `min_prob`, at
        most `max_children` per parent and `max_nodes` in all, highest fraction first."""
        length, found = self.match(sid)
        depth = min(max_depth, int(factor * length))
        if depth <= 0:
            return length, []
        children: list[dict[int, int]] = [{}]  # node -> {token: child}; node 0 the root
        counts, tokens, parents = [len(found)], [-1], [-1]
        for stream, start in found:
            node = 0
            for token in stream[start:start + depth]:
                child = children[node].get(token)
                if child is None:
                    child = children[node][token] = len(counts)
                    children.append({})
                    counts.append(0)
                    tokens.append(token)
                    parents.append(node)
                counts[child] += 1
                node = child
        total = len(found)
        kept, heap = [], [(-total, 0, 0)]
        while heap and len(kept) < max_nodes + 1:
            _, _, node = heapq.heappop(heap)
            kept.append(node)
            best = sorted(children[node].values(), key=lambda c: -counts[c])[:max_children]
            for child in best:
                if counts[child] >= min_prob * total:
                    heapq.heappush(heap, (-counts[child], child, child))
        paths = []
        for node in kept[1:]:  # the root is the bonus token, not a draft
            path = []
            while node > 0:
                path.append(tokens[node])
                node = parents[node]
            paths.append(path[::-1])
        return length, paths


def _match_length(stream: list[int], end: int, ctx: list[int], known: int, cap: int) -> int:
    """How many tokens before and at `end` in `stream` equal the end of `ctx` (the first `known` do),
    at most `cap` (and never past either's start): the largest m with equal slices, by halving."""
    top = min(cap, end + 1, len(ctx))
    lo, hi = min(known, top), top  # slices of lo tokens are equal; find the largest such m <= hi
    size = len(ctx)
    if stream[end - hi + 1:end + 1] == ctx[size - hi:]:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if stream[end - mid + 1:end + 1] == ctx[size - mid:]:
            lo = mid
        else:
            hi = mid
    return lo
