"""What adaptive speculation chooses between: a step count (a chain of the configured drafter; 0 = plain
decoding), a `TreeShape` of the configured drafter, or a `DrafterCandidate`: another drafter (n-gram
lookup, or the head with n-gram lookup) at a chain length or tree shape of its own."""

from dataclasses import dataclass

from engine.speculative.tree import TreeShape

# drafters a candidate may switch to; each keeps its state current on every request while another drafts
OTHER_DRAFTERS = ("ngram", "hybrid")


@dataclass(frozen=True)
class DrafterCandidate:
    drafter: str  # one of OTHER_DRAFTERS
    shape: "int | TreeShape"  # a chain's step count (>= 1) or a tree shape

    @property
    def num_steps(self) -> int:
        return self.shape.num_steps if isinstance(self.shape, TreeShape) else self.shape

    @property
    def topk(self) -> int:
        return self.shape.topk if isinstance(self.shape, TreeShape) else 1

    @property
    def num_draft_tokens(self) -> int:
        return self.shape.num_draft_tokens if isinstance(self.shape, TreeShape) else self.shape + 1

    @property
    def label(self) -> str:
        return f"{self.drafter}:{self.shape}"

    def __str__(self) -> str:
        return self.label


Candidate = int | TreeShape | DrafterCandidate


def configured_candidate(num_steps: int, topk: int = 1, num_draft_tokens: int | None = None) -> int | TreeShape:
    """The configured drafter's candidate for a shape: its step count (a chain) or its tree shape."""
    return num_steps if topk == 1 else TreeShape(num_steps, topk, num_draft_tokens)


def shape_of(candidate: Candidate) -> TreeShape:
    """The chain or tree a candidate drafts and verifies (a chain of k: k x 1 / k + 1)."""
    if isinstance(candidate, TreeShape):
        return candidate
    if isinstance(candidate, DrafterCandidate):
        return shape_of(candidate.shape)
    return TreeShape(candidate, 1, candidate + 1)


def drafter_of(candidate: Candidate) -> str | None:
    """The drafter a candidate switches to; None: the configured one."""
    return candidate.drafter if isinstance(candidate, DrafterCandidate) else None


def candidate_sort_key(candidate: Candidate) -> tuple[int, int, int, str]:
    """Orders every kind of candidate together: by steps, then topk, then nodes, then drafter (configured first)."""
    shape = shape_of(candidate)
    return shape.num_steps, shape.topk, shape.num_draft_tokens, drafter_of(candidate) or ""


def label_of(candidate: Candidate) -> int | str:
    """A candidate as metrics show it: the step count of a chain, else its label (`5x4/16`, `ngram:7`)."""
    return candidate if isinstance(candidate, int) else candidate.label
