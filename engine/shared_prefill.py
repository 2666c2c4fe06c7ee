"""A prompt's `n` samples prefill once: the first of them runs the forward, the others take its KV and
its outputs.

Siblings are requests of one prompt that start together with nothing generated yet (`sample_index`
telling them apart, the same prompt ids, the same cached prefix). The target forward runs over the
first sibling's prompt only; each other sibling's KV slots receive a copy of its K and V past the
cached prefix, layer by layer (a copy of the cache rows, against a forward over every prompt token),
and its logits and hidden states are the first's.
Each sibling then samples its own first token (its own seed) and its drafter starts on its own.
With the prefix cache on, the copies last one step: as the first sibling's whole prompt pages join the
cache, the others give their copies of them back and hold the cached pages (`KVCacheManager.cache`),
so n samples keep one prompt's KV and a private tail each.
"""

from dataclasses import dataclass

import torch

from eyas.engine.runner import ForwardOutput


@dataclass
class Siblings:
    """For requests [R] of one step: `computed` the indices that run the forward, `source[i]` the index
    whose forward request i takes (itself for a computed one)."""

    computed: list[int]
    source: list[int]

    @classmethod
    def of(cls, requests, fresh: list[bool]) -> "Siblings":
        """fresh[i]: request i extends its whole prompt this step (a prefill with no output yet)."""
        first_of: dict[tuple, int] = {}
        computed, source = [], []
        for i, (request, new) in enumerate(zip(requests, fresh)):
            key = (tuple(request.prompt_ids), request.num_computed) if new and request.params.n > 1 else None
            if key is not None and key in first_of:
                source.append(first_of[key])
                continue
            if key is not None:
                first_of[key] = i
            computed.append(i)
            source.append(i)
        return cls(computed, source)

    @property
    def shared(self) -> bool:
        return len(self.computed) < len(self.source)

    def copy_kv(self, requests, pool, req_to_token: torch.Tensor) -> None:
        """Each sibling's prompt KV past its cached prefix from the request whose forward it takes, in
        every layer of `pool`."""
        for i, j in enumerate(self.source):
            if i != j:
                start, n = requests[i].num_computed, len(requests[i].prompt_ids)
                dst, src = req_to_token[requests[i].row, start:n], req_to_token[requests[j].row, start:n]
                for layer in range(pool.num_layers):
                    pool.k[layer][dst] = pool.k[layer][src]
                    pool.v[layer][dst] = pool.v[layer][src]
                requests[i].kv_copied_from = requests[j].row  # the prefix cache may swap the copy for the source

    def expand(self, out: ForwardOutput, extend_lens: list[int]) -> ForwardOutput:
        """The forward of the computed requests (one logits row each, `extend_lens` tokens each, in order)
        as every request's: rows and token ranges repeated for the siblings."""
        position = {j: k for k, j in enumerate(self.computed)}
        return out.of_requests(extend_lens, [position[j] for j in self.source])
