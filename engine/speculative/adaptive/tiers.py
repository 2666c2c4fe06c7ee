"""Batch-size tiers: each tier lists the candidates adaptive speculation may choose at that size.

A candidate (`engine/speculative/candidate.py`) is a drafter at a chain length or tree shape; config
lists a chain of the configured drafter by its step count (0 = plain decoding). A batch is padded up to the first tier whose batch_size is at least its size (the last tier takes
anything larger).
"""

from dataclasses import dataclass

from eyas.engine.speculative.candidate import Candidate, parse_candidate


@dataclass(frozen=True)
class Tier:
    batch_size: int
    candidates: tuple[Candidate, ...]  # configured chains by step count ascending, then trees and other drafters; distinct
    initial: Candidate  # the candidate this tier starts at

    @classmethod
    def from_config(cls, batch_size: int, candidates, initial) -> "Tier":
        return cls(int(batch_size), tuple(parse_candidate(c) for c in candidates), parse_candidate(initial))


def chains_of(candidates) -> tuple[Candidate, ...]:
    """The configured drafter's chains: their acceptance is one model over draft positions."""
    return tuple(c for c in candidates if c.is_configured_chain)


def others_of(candidates) -> tuple[Candidate, ...]:
    """Tree shapes and other drafters: each one's acceptance and cost are measured on their own."""
    return tuple(c for c in candidates if not c.is_configured_chain)


def tier_index(tiers: list[Tier], batch_size: int) -> int:
    for i, tier in enumerate(tiers):
        if batch_size <= tier.batch_size:
            return i
    return len(tiers) - 1


def middle_candidate(candidates) -> Candidate:
    """Where a tier starts when the configured candidate is not one of its own: its middle configured
    chain (the middle candidate when it lists none)."""
    chains = chains_of(candidates) or tuple(candidates)
    return chains[len(chains) // 2]


def build_tiers(tiers, configured: Candidate) -> list[Tier]:
    """Tiers from the (validated) config's `(batch_size, candidates)` pairs; each starts at the configured
    candidate when it is one of its candidates, else at its middle candidate."""
    built = []
    for batch_size, listed in tiers:
        candidates = tuple(parse_candidate(c) for c in listed)
        initial = configured if configured in candidates else middle_candidate(candidates)
        built.append(Tier.from_config(batch_size, candidates, initial))
    return built

