"""AdaptiveController: picks the step count of each decode iteration and learns from its outcome.

One policy per batch-size tier. `choose(batch_size)` pads the batch up to its tier and returns that
tier's current step count; `observe` feeds the tier's policy with the host-side accept counts of the
verify just done (accepted drafts per request) and the measured phase times.
"""

from collections import Counter
from collections.abc import Callable

from engine.speculative.adaptive.tiers import Tier, tier_index


class AdaptiveController:
    def __init__(self, tiers: list[Tier], make_policy: Callable[..., object]):
        # make_policy(candidates=..., initial=...) -> a policy with `steps` and `observe(...)`
        self.tiers = tiers
        self.policies = [make_policy(candidates=tier.candidates, initial=tier.initial) for tier in tiers]
        self.cycles_at_steps: Counter = Counter()
        self.num_switches = 0
        self.history: list[list[int]] = []  # [steps, cycles] runs in order: the choices over time
        self._last: int | None = None

    @property
    def needs_timings(self) -> bool:
        """Whether any tier's policy reads phase times (on CUDA, timing costs a device sync per phase)."""
        return any(policy.needs_timings for policy in self.policies)

    @property
    def all_candidates(self) -> set[int]:
        return {k for tier in self.tiers for k in tier.candidates}

    def choose(self, batch_size: int) -> int:
        steps = self.policies[tier_index(self.tiers, batch_size)].steps
        if self._last is not None and steps != self._last:
            self.num_switches += 1
        self._last = steps
        self.cycles_at_steps[steps] += 1
        if self.history and self.history[-1][0] == steps:
            self.history[-1][1] += 1
        else:
            self.history.append([steps, 1])
        return steps

    def observe(self, batch_size: int, num_steps: int, accepted_drafts: list[int], timings: dict) -> None:
        self.policies[tier_index(self.tiers, batch_size)].observe(num_steps, accepted_drafts, timings)

    def stats(self) -> dict:
        return {
            "adaptive_cycles_at_steps": dict(sorted(self.cycles_at_steps.items())),
            "adaptive_switches": self.num_switches,
        }
