"""Candidate: what one runtime state drafts and verifies, and what adaptive speculation chooses between.

A drafter at a shape: `num_steps` draft steps, `topk` children per expanded node, `num_draft_tokens`
nodes verified (the root, the pending bonus token, counted). A chain is the shape with topk 1 and
num_steps + 1 nodes; 0 steps is plain decoding through the verify path. `drafter` None means the
configured drafter; another one (`registry.CANDIDATE_DRAFTERS`) is a lookup drafter or the hybrid rule,
drafted by the host drafter that holds them all (see `engine/speculative/drafters/hybrid.py`).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    num_steps: int
    topk: int = 1
    num_draft_tokens: int | None = None  # None: a chain's, num_steps + 1
    drafter: str | None = None  # None: the configured drafter; else one of registry.CANDIDATE_DRAFTERS

    def __post_init__(self):
        if self.num_draft_tokens is None:
            object.__setattr__(self, "num_draft_tokens", self.num_steps + 1)

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    @property
    def is_configured_chain(self) -> bool:
        """A chain of the configured drafter: every such chain shares one acceptance model and one cost line."""
        return self.is_chain and self.drafter is None

    @property
    def shape(self) -> "Candidate":
        """The same shape drafted by the configured drafter."""
        return Candidate(self.num_steps, self.topk, self.num_draft_tokens)

    @property
    def label(self) -> int | str:
        """As metrics show it: a configured chain's step count, else `5x4/16` (a tree) or `ngram:7`."""
        shape = str(self.num_steps) if self.is_chain else f"{self.num_steps}x{self.topk}/{self.num_draft_tokens}"
        if self.drafter is not None:
            return f"{self.drafter}:{shape}"
        return self.num_steps if self.is_chain else shape

    def sort_key(self) -> tuple[int, int, int, str]:
        """Orders every candidate together: by steps, then topk, then nodes, then drafter (configured first)."""
        return self.num_steps, self.topk, self.num_draft_tokens, self.drafter or ""

    def __str__(self) -> str:
        return str(self.label)


def parse_candidate(value) -> Candidate:
    """A candidate as config writes it: a step count (a chain of the configured drafter); a tree shape
    {num_steps, topk, num_draft_tokens}; or another drafter, {drafter, num_steps} (a chain) or
    {drafter, num_steps, topk, num_draft_tokens} (a tree). Values are checked by config validation."""
    if isinstance(value, Candidate):
        return value
    if hasattr(value, "keys"):
        topk = int(value["topk"]) if "topk" in value else 1
        nodes = int(value["num_draft_tokens"]) if "num_draft_tokens" in value else None
        drafter = str(value["drafter"]) if "drafter" in value else None
        return Candidate(int(value["num_steps"]), topk, nodes, drafter)
    return Candidate(int(value))


def sorted_candidates(candidates) -> list[Candidate]:
    return sorted(set(candidates), key=Candidate.sort_key)
