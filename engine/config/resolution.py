"""What the composed config leaves to be derived: the tree's node count, the adaptive policy `auto`,
and where adaptive speculation starts.

`resolve` derives only from well-formed values and leaves the others as they are, for `validate` to
report by name. A resolved config resolves to itself, with no notices.
"""

import copy

from eyas.engine.speculative.adaptive.tiers import middle_candidate
from eyas.engine.speculative.candidate import Candidate, parse_candidate
from eyas.engine.speculative.drafters.registry import HOSTS, fixed_depth, grafts_lookup


def resolve(config: dict) -> tuple[dict, list[str]]:
    """A resolved copy of `config` (which is left as it is) and the notices to show."""
    config = copy.deepcopy(config)
    spec, adaptive = config["speculative"], config["adaptive"]
    if spec["num_draft_tokens"] is None and _is_int(spec["num_steps"]) and _is_int(spec["topk"]):
        spec["num_draft_tokens"] = default_draft_tokens(spec["algorithm"], spec["num_steps"], spec["topk"])
    auto = adaptive["policy"] == "auto"
    if auto:  # adaptive chains; plain decoding, a configured tree and suffix decoding as they are
        tree = _is_int(spec["topk"]) and spec["topk"] > 1
        fixed = fixed_depth(spec["algorithm"]) or tree  # e.g. suffix decoding: each draft's depth follows its match
        adaptive["policy"] = "off" if fixed else "throughput"
    notices = _drop_unhosted_drafters(spec, adaptive, say=not auto)
    return config, notices + _start_in_first_tier(spec, adaptive)


def _drop_unhosted_drafters(spec: dict, adaptive: dict, say: bool) -> list[str]:
    """Other drafters' candidates share an EAGLE head's state: with any other configured drafter they are
    left out of the tiers, and so is the configured drafter's own (`speculative=hybrid` lists its chains by
    step count). Said when the policy was set explicitly; `auto` takes the tiers as they fit."""
    algorithm = spec["algorithm"]
    if adaptive["policy"] == "off" or not isinstance(adaptive.get("tiers"), list):
        return []

    def unfit(c) -> bool:
        return hasattr(c, "keys") and "drafter" in c and (algorithm not in HOSTS or c["drafter"] == algorithm)

    dropped = []
    for tier in adaptive["tiers"]:
        if not isinstance(tier, dict) or not isinstance(tier.get("candidates"), list):
            continue
        kept = [c for c in tier["candidates"] if not unfit(c)]
        if kept and len(kept) < len(tier["candidates"]):
            dropped += [c for c in tier["candidates"] if c not in kept]
            tier["candidates"] = kept
    if not dropped or not say:
        return []
    return [f"adaptive: other drafters need the EAGLE head they share state with (speculative {', '.join(HOSTS)}), "
            f"and the configured drafter lists its own by step count; left out with speculative.algorithm="
            f"{algorithm!r}: {[dict(c) for c in dropped]}"]


def default_draft_tokens(algorithm: str, num_steps: int, topk: int) -> int:
    """A chain's nodes; a tree's: every step's frontier plus the root (the hybrid: and its n-gram branches)."""
    nodes = num_steps * topk + 1
    if grafts_lookup(algorithm) and topk > 1:
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
