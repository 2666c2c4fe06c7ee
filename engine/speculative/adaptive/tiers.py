"""Batch-size tiers: each tier lists the step counts adaptive speculation may choose at that size.

A batch is padded up to the first tier whose batch_size is at least its size (the last tier takes
anything larger).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Tier:
    batch_size: int
    candidates: tuple[int, ...]  # sorted, distinct, >= 0
    initial: int  # the candidate this tier starts at

    @classmethod
    def from_config(cls, batch_size: int, candidates, initial: int) -> "Tier":
        return cls(int(batch_size), tuple(int(c) for c in candidates), int(initial))


def tier_index(tiers: list[Tier], batch_size: int) -> int:
    for i, tier in enumerate(tiers):
        if batch_size <= tier.batch_size:
            return i
    return len(tiers) - 1


def middle_candidate(candidates) -> int:
    return candidates[len(candidates) // 2]


def build_tiers(tiers: list[dict], num_steps: int) -> list[Tier]:
    """Tiers from the (validated) config; each starts at `num_steps` when it is one of its
    candidates, else at its middle candidate."""
    built = []
    for tier in tiers:
        candidates = tuple(tier["candidates"])
        initial = num_steps if num_steps in candidates else middle_candidate(candidates)
        built.append(Tier.from_config(tier["batch_size"], candidates, initial))
    return built
