"""Batch-size tiers: each tier lists the candidates adaptive speculation may choose at that size.

A candidate (`engine/speculative/candidate.py`) is a step count (a chain of that many drafts; 0 =
plain decoding), a `TreeShape`, or a `DrafterCandidate` (another drafter at a shape of its own).
A batch is padded up to the first tier whose batch_size is at least its size (the last tier takes
anything larger).
"""

from dataclasses import dataclass

from engine.speculative.candidate import Candidate, DrafterCandidate, candidate_sort_key
from engine.speculative.tree import TreeShape


@dataclass(frozen=True)
class Tier:
    batch_size: int
    candidates: tuple[Candidate, ...]  # step counts ascending, then tree shapes and other drafters; distinct
    initial: Candidate  # the candidate this tier starts at

    @classmethod
    def from_config(cls, batch_size: int, candidates, initial) -> "Tier":
        return cls(int(batch_size), tuple(parse_candidate(c) for c in candidates), parse_candidate(initial))


def parse_candidate(value) -> Candidate:
    """A step count; a tree shape given as a mapping {num_steps, topk, num_draft_tokens}; or another
    drafter, {drafter, num_steps} (a chain) or {drafter, num_steps, topk, num_draft_tokens} (a tree)."""
    if isinstance(value, (TreeShape, DrafterCandidate)):
        return value
    if isinstance(value, dict) or hasattr(value, "keys"):
        steps = int(value["num_steps"])
        shape = TreeShape(steps, int(value["topk"]), int(value["num_draft_tokens"])) if "topk" in value else steps
        return DrafterCandidate(str(value["drafter"]), shape) if "drafter" in value else shape
    return int(value)


def chains_of(candidates) -> tuple[int, ...]:
    """The configured drafter's chains: their acceptance is one model over draft positions."""
    return tuple(c for c in candidates if isinstance(c, int))


def others_of(candidates) -> tuple[Candidate, ...]:
    """Tree shapes and other drafters: each one's acceptance and cost are measured on their own."""
    return tuple(c for c in candidates if not isinstance(c, int))


def tier_index(tiers: list[Tier], batch_size: int) -> int:
    for i, tier in enumerate(tiers):
        if batch_size <= tier.batch_size:
            return i
    return len(tiers) - 1


def middle_candidate(candidates) -> Candidate:
    """The middle step count (the first other candidate when there is none)."""
    chains = chains_of(candidates) or tuple(candidates)
    return chains[len(chains) // 2]


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
    return sorted(set(candidates), key=candidate_sort_key)
