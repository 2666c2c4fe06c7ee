"""Per-position acceptance, shared by every tier (acceptance depends on the text, not on the batch size).

Position i (1-based) is *reached* in a cycle when it was drafted and every draft before it was
accepted; its conditional rate a_i = accepted_i / reached_i, and the expected number of accepted
drafts with k steps is sum_{i<=k} prod_{j<=i} a_j.

Counts are kept on two time scales. The *profile* (slow decay) says how acceptance falls with depth;
it holds for positions that are not drafted now. The *recent* counts (fast decay, `decay` per cycle)
say how easy the current text is. A position's rate is its recent count shrunk toward the profile
rescaled by the current difficulty: the accepts seen lately over the accepts the profile predicts
for the positions reached lately. So a position deeper than the step count in use still moves with
the text (prose lowers every depth, code raises every depth), and one that is drafted often follows
its own measurements. Rates are made non-increasing with depth; positions never reached take the
deepest measured rate.
"""

PROFILE_DECAY = 0.998  # per cycle: the profile remembers the last few hundred cycles
PRIOR_STRENGTH = 4.0  # pseudo-counts of the rescaled profile in each recent rate


class AcceptanceModel:
    def __init__(self, decay: float, profile_decay: float = PROFILE_DECAY, prior_strength: float = PRIOR_STRENGTH):
        self.decay = decay
        self.profile_decay = profile_decay
        self.prior_strength = prior_strength
        self.reached: list[float] = []  # recent, per position
        self.accepted: list[float] = []
        self.profile_reached: list[float] = []
        self.profile_accepted: list[float] = []

    def observe(self, num_steps: int, accepted_drafts: list[int]) -> None:
        if num_steps == 0 or not accepted_drafts:
            return
        if len(self.reached) < num_steps:
            for counts in (self.reached, self.accepted, self.profile_reached, self.profile_accepted):
                counts.extend([0.0] * (num_steps - len(counts)))
        for counts, decay in ((self.reached, self.decay), (self.accepted, self.decay),
                              (self.profile_reached, self.profile_decay), (self.profile_accepted, self.profile_decay)):
            counts[:] = [c * decay for c in counts]
        for n in accepted_drafts:
            for i in range(min(n + 1, num_steps)):
                self.reached[i] += 1.0
                self.profile_reached[i] += 1.0
            for i in range(n):
                self.accepted[i] += 1.0
                self.profile_accepted[i] += 1.0

    def profile_rates(self, depth: int) -> list[float] | None:
        """Long-run a_1..a_depth, non-increasing; None before any draft was measured."""
        rates = [a / r for a, r in zip(self.profile_accepted, self.profile_reached) if r > 1e-9]
        if not rates:
            return None
        for i in range(1, len(rates)):
            rates[i] = min(rates[i], rates[i - 1])
        return [rates[min(i, len(rates) - 1)] for i in range(depth)]

    def difficulty(self) -> float:
        """Recent accepts over those the profile predicts at the positions reached lately (1: as usual)."""
        profile = [a / r if r > 1e-9 else 0.0 for a, r in zip(self.profile_accepted, self.profile_reached)]
        expected = sum(r * p for r, p in zip(self.reached, profile))
        observed = sum(self.accepted)
        m = self.prior_strength
        return (observed + m) / (expected + m)  # shrunk toward 1 while little was seen lately

    def conditional_rates(self, depth: int) -> list[float] | None:
        """a_1..a_depth for the current text, or None before any draft was measured."""
        profile = self.profile_rates(max(depth, len(self.reached)))
        if profile is None:
            return None
        scale, m = self.difficulty(), self.prior_strength
        rates = []
        for i in range(depth):
            prior = min(1.0, profile[i] * scale)
            reached = self.reached[i] if i < len(self.reached) else 0.0
            accepted = self.accepted[i] if i < len(self.accepted) else 0.0
            rate = (accepted + m * prior) / (reached + m)
            rates.append(min(rate, rates[-1]) if rates else rate)
        return rates

    def expected_accepted(self, depth: int) -> list[float] | None:
        """Expected accepted drafts at k = 0..depth steps (sum_{i<=k} prod_{j<=i} a_j), or None before any
        draft was measured (when depth > 0)."""
        if depth == 0:
            return [0.0]
        rates = self.conditional_rates(depth)
        if rates is None:
            return None
        expected, survive = [0.0], 1.0
        for a in rates:
            survive *= a
            expected.append(expected[-1] + survive)
        return expected
