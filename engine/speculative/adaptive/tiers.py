"""Batch-size tiers: each tier lists the candidates adaptive speculation may choose at that size.

A candidate is a step count (a chain of that many drafts; 0 = plain decoding) or a `TreeShape`.
A batch is padded up to the first tier whose batch_size is at least its size (the last tier takes
anything larger).
"""

from dataclasses import dataclass

from engine.speculative.tree import TreeShape, shape_sort_key

Candidate = int | TreeShape


@dataclass(frozen=True)
class Tier:
    batch_size: int
    candidates: tuple[Candidate, ...]  # step counts ascending, then tree shapes; distinct
    initial: Candidate  # the candidate this tier starts at

    @classmethod
    def from_config(cls, batch_size: int, candidates, initial) -> "Tier":
        return cls(int(batch_size), tuple(parse_candidate(c) for c in candidates), parse_candidate(initial))


def parse_candidate(value) -> Candidate:
    """A step count, or a tree shape given as a mapping {num_steps, topk, num_draft_tokens}."""
    if isinstance(value, TreeShape):
        return value
    if isinstance(value, dict) or hasattr(value, "keys"):
        return TreeShape(int(value["num_steps"]), int(value["topk"]), int(value["num_draft_tokens"]))
    return int(value)


def chains_of(candidates) -> tuple[int, ...]:
    return tuple(c for c in candidates if not isinstance(c, TreeShape))


def trees_of(candidates) -> tuple[TreeShape, ...]:
    return tuple(c for c in candidates if isinstance(c, TreeShape))


def tier_index(tiers: list[Tier], batch_size: int) -> int:
    for i, tier in enumerate(tiers):
        if batch_size <= tier.batch_size:
            return i
    return len(tiers) - 1


def middle_candidate(candidates) -> Candidate:
    """The middle step count (the first tree shape when there is none)."""
    chains = chains_of(candidates) or tuple(candidates)
    return chains[len(chains) // 2]


def configured_candidate(num_steps: int, topk: int = 1, num_draft_tokens: int | None = None) -> Candidate:
    return num_steps if topk == 1 else TreeShape(num_steps, topk, num_draft_tokens)


def build_tiers(tiers: list[dict], configured: Candidate) -> list[Tier]:
    """Tiers from the (validated) config; each starts at the configured candidate when it is one of
    its candidates, else at its middle candidate."""
    built = []
    for tier in tiers:
        candidates = tuple(parse_candidate(c) for c in tier["candidates"])
        initial = configured if configured in candidates else middle_candidate(candidates)
        built.append(Tier.from_config(tier["batch_size"], candidates, initial))
    return built


def sorted_candidates(candidates) -> list[Candidate]:
    return sorted(set(candidates), key=shape_sort_key)
