"""Which replica was last sent which prompt prefixes: the prefix-aware router's picture of the replicas'
prefix caches, as SGLang's gateway and Ray Serve's prefix router keep one.

A request's routing text is cut into chunks of `chunk_chars`; chunk i is keyed by a hash of the text up to
its end (a chain, like the engine's page hashes), so a replica holds a prefix of the request exactly when it
holds the chain's keys up to it. Each replica keeps at most `max_chunks` keys, least recently used out
first: a replica's cache forgets too, and the index must not grow without bound.
"""

import hashlib
from collections import OrderedDict


class PrefixIndex:
    def __init__(self, chunk_chars: int = 64, max_chunks: int = 65536):
        self.chunk_chars, self.max_chunks = chunk_chars, max_chunks
        self._chunks: dict[str, OrderedDict[bytes, None]] = {}  # replica -> chunk keys, least recent first

    def keys(self, text: str) -> list[bytes]:
        """The chain keys of `text`'s whole chunks (a tail shorter than a chunk is not keyed)."""
        data, keys, digest = text.encode(), [], b""
        step = self.chunk_chars
        for end in range(step, len(data) + 1, step):
            digest = hashlib.blake2b(digest + data[end - step:end], digest_size=16).digest()
            keys.append(digest)
        return keys

    def matched_chars(self, keys: list[bytes]) -> dict[str, int]:
        """Per replica, how many leading characters of the keyed text it was sent before."""
        matched = {}
        for replica, held in self._chunks.items():
            n = 0
            while n < len(keys) and keys[n] in held:
                n += 1
            matched[replica] = n * self.chunk_chars
        return matched

    def insert(self, replica: str, keys: list[bytes]) -> None:
        held = self._chunks.setdefault(replica, OrderedDict())
        for key in keys:
            held[key] = None
            held.move_to_end(key)
        while len(held) > self.max_chunks:
            held.popitem(last=False)

    def add(self, replica: str) -> None:
        self._chunks.setdefault(replica, OrderedDict())

    def remove(self, replica: str) -> None:
        """A replica gone (its cache with it)."""
        self._chunks.pop(replica, None)
