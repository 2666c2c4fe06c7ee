"""What the composed config leaves to be derived: the tree's node count, the adaptive policy `auto`,
and where adaptive speculation starts.

`resolve` derives only from well-formed values and leaves the others as they are, for `validate` to
report by name. A resolved config resolves to itself, with no notices.
"""

import copy

from engine.speculative.adaptive.tiers import middle_candidate
from engine.speculative.candidate import Candidate, parse_candidate


def resolve(config: dict) -> tuple[dict, list[str]]:
    """A resolved copy of `config` (which is left as it is) and the notices to show."""
    config = copy.deepcopy(config)
    spec, adaptive = config["speculative"], config["adaptive"]
    if spec["num_draft_tokens"] is None and _is_int(spec["num_steps"]) and _is_int(spec["topk"]):
        spec["num_draft_tokens"] = default_draft_tokens(spec["algorithm"], spec["num_steps"], spec["topk"])
    if adaptive["policy"] == "auto":  # adaptive chains; plain decoding and a configured tree as they are
        tree = _is_int(spec["topk"]) and spec["topk"] > 1
        adaptive["policy"] = "off" if spec["algorithm"] == "none" or tree else "throughput"
    return config, _start_in_first_tier(spec, adaptive)


def default_draft_tokens(algorithm: str, num_steps: int, topk: int) -> int:
    """A chain's nodes; a tree's: every step's frontier plus the root (the hybrid: and its n-gram branches)."""
    nodes = num_steps * topk + 1
    if algorithm == "hybrid" and topk > 1:
        nodes += num_steps * topk
    return nodes


def _start_in_first_tier(spec: dict, adaptive: dict) -> list[str]:
    """With adaptive speculation, when the configured shape is not a candidate of the first tier: start
    at that tier's middle candidate (written into `spec`), and say so."""
    if adaptive["policy"] == "off" or spec["algorithm"] == "none":
        return []
    configured, first = _configured(spec), _first_tier(adaptive["tiers"])
    if configured is None or first is None or configured in first:
        return []
    start = middle_candidate(first)
    if configured == start.shape:  # resolved already, to a start of another drafter
        return []
    name = f"speculative.num_steps={configured.num_steps}" if configured.is_chain else f"the tree {configured}"
    spec["num_steps"], spec["topk"], spec["num_draft_tokens"] = start.num_steps, start.topk, start.num_draft_tokens
    return [f"adaptive: {name} is not a candidate of the first tier {[str(c) for c in first]}; "
            f"starting at its middle candidate, {start}"]


def _configured(spec: dict) -> Candidate | None:
    """The configured drafter's shape; None when it is not one (validate says why)."""
    steps, topk, nodes = spec["num_steps"], spec["topk"], spec["num_draft_tokens"]
    if not all(_is_int(v) for v in (steps, topk, nodes)) or steps < 0 or topk < 1:
        return None
    if topk == 1 and nodes != steps + 1:
        return None
    return Candidate(steps, topk, nodes)


def _first_tier(tiers) -> list[Candidate] | None:
    """The first tier's candidates; None when there are none or they do not parse (validate says why)."""
    candidates = tiers[0].get("candidates") if tiers else None
    if not candidates:
        return None
    try:
        return [parse_candidate(c) for c in candidates]
    except (KeyError, TypeError, ValueError):
        return None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
