"""AdaptiveController: picks the candidate (step count, tree shape or other drafter) of each decode
iteration and learns from its outcome.

One policy per batch-size tier and kind of batch: greedy batches and sampled ones (most of whose
requests sample) accept drafts at very different rates, so each kind learns on its own and a change
of workload from one to the other does not start from the other's figures. `choose(batch_size,
sampled)` pads the batch up to its tier and returns that tier's current candidate for the kind;
`observe` feeds the same policy with the candidate just run, the host-side accept counts of its
verify (accepted drafts per request) and the measured phase times.
Counts per candidate are reported by step count for chains and by label for the rest (`5x4/16`, `ngram:7`).
"""

from collections import Counter
from collections.abc import Callable

from eyas.engine.speculative.adaptive.tiers import Tier, tier_index
from eyas.engine.speculative.candidate import Candidate


class AdaptiveController:
    def __init__(self, tiers: list[Tier], make_policy: Callable[..., object],
                 make_sampled_policy: Callable[..., object] | None = None):
        # make_policy(candidates=..., initial=...) -> a policy with `choice` and `observe(...)`; the
        # sampled batches' policies come from make_sampled_policy (default: make_policy)
        self.tiers = tiers
        makers = {False: make_policy, True: make_sampled_policy or make_policy}
        self.policies = {sampled: [make(candidates=tier.candidates, initial=tier.initial) for tier in tiers]
                         for sampled, make in makers.items()}
        self.cycles_at_steps: Counter = Counter()
        self.num_switches = 0
        self.history: list[list] = []  # [candidate, cycles] runs in order: the choices over time
        self._last: dict[bool, Candidate] = {}  # per kind of batch: its last choice

    @property
    def needs_timings(self) -> bool:
        """Whether any tier's policy reads phase times (on CUDA, timing costs a device sync per phase)."""
        return any(policy.needs_timings for policies in self.policies.values() for policy in policies)

    @property
    def all_candidates(self) -> set[Candidate]:
        return {k for tier in self.tiers for k in tier.candidates}

    def choose(self, batch_size: int, sampled: bool = False) -> Candidate:
        choice = self.policies[sampled][tier_index(self.tiers, batch_size)].choice
        if sampled in self._last and choice != self._last[sampled]:  # a switch within one kind's policies
            self.num_switches += 1
        self._last[sampled] = choice
        self.cycles_at_steps[choice] += 1
        if self.history and self.history[-1][0] == choice:
            self.history[-1][1] += 1
        else:
            self.history.append([choice, 1])
        return choice

    def observe(self, batch_size: int, candidate: Candidate, accepted_drafts: list[int], timings: dict,
                sampled: bool = False) -> None:
        self.policies[sampled][tier_index(self.tiers, batch_size)].observe(candidate, accepted_drafts, timings)

    def stats(self) -> dict:
        counts = sorted(self.cycles_at_steps.items(), key=lambda item: item[0].sort_key())
        return {
            "adaptive_cycles_at_steps": {c.label: n for c, n in counts},
            "adaptive_switches": self.num_switches,
        }

