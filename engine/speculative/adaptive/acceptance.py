"""Per-position acceptance, shared by every tier (acceptance depends on the text, not on the batch size).

Position i (1-based) is *reached* in a cycle when it was drafted and every draft before it was
accepted; its conditional rate a_i = accepted_i / reached_i, and the expected number of accepted
drafts with k steps is sum_{i<=k} prod_{j<=i} a_j.

Counts are kept on two time scales. The *profile* (slow decay) says how acceptance falls with depth;
it holds for positions that are not drafted now. The *recent* counts (fast decay, `decay` per cycle)
say how easy the current text is: the *difficulty* is the accepts seen lately over the accepts the
profile predicts for the positions reached lately. Each position also keeps its *own* recent counts,
which age fast (`decay`) only in cycles that draft that deep and slowly (`profile_decay`) in the
others: they are its latest measurements, however long ago the policy last drafted that deep. A
position's rate is its own counts shrunk toward the profile rescaled by the difficulty. So a position
deeper than the step count in use moves with the text where the text shows at the depths drafted
(prose lowers every depth, code raises every depth), and keeps what it measured where it does not:
code and prose can accept the first draft alike and part only at the second, which a policy running
one step would otherwise forget between its probes. Rates are made non-increasing with depth; in the
profile each position is shrunk toward the one before it, so a position never (or seldom) reached
takes about its predecessor's rate.
"""

PROFILE_DECAY = 0.998  # per cycle: the profile remembers the last few hundred cycles
PRIOR_STRENGTH = 4.0  # pseudo-counts of the prior in each rate: the rescaled profile (own), the previous position (profile)


class AcceptanceModel:
    def __init__(self, decay: float, profile_decay: float = PROFILE_DECAY, prior_strength: float = PRIOR_STRENGTH):
        self.decay = decay
        self.profile_decay = profile_decay
        self.prior_strength = prior_strength
        self.reached: list[float] = []  # recent, per position
        self.accepted: list[float] = []
        self.own_reached: list[float] = []  # recent in the cycles that drafted the position
        self.own_accepted: list[float] = []
        self.profile_reached: list[float] = []
        self.profile_accepted: list[float] = []

    def _all_counts(self) -> tuple[list[float], ...]:
        return (self.reached, self.accepted, self.own_reached, self.own_accepted,
                self.profile_reached, self.profile_accepted)

    def observe(self, num_steps: int, accepted_drafts: list[int]) -> None:
        if num_steps == 0 or not accepted_drafts:
            return
        if len(self.reached) < num_steps:
            for counts in self._all_counts():
                counts.extend([0.0] * (num_steps - len(counts)))
        for counts, decay in ((self.reached, self.decay), (self.accepted, self.decay),
                              (self.profile_reached, self.profile_decay), (self.profile_accepted, self.profile_decay)):
            counts[:] = [c * decay for c in counts]
        for counts in (self.own_reached, self.own_accepted):
            counts[:] = [c * (self.decay if i < num_steps else self.profile_decay) for i, c in enumerate(counts)]
        for n in accepted_drafts:
            for i in range(min(n + 1, num_steps)):
                for counts in (self.reached, self.own_reached, self.profile_reached):
                    counts[i] += 1.0
            for i in range(n):
                for counts in (self.accepted, self.own_accepted, self.profile_accepted):
                    counts[i] += 1.0

    def profile_rates(self, depth: int) -> list[float] | None:
        """Long-run a_1..a_depth, non-increasing; None before any draft was measured.

        Each position past the first is shrunk toward the rate of the one before it (`prior_strength`
        pseudo-counts): a few early cycles that reached a position and missed there cannot set its
        rate, and every deeper one, to 0 for good (the policy would then never draft that deep again
        to learn otherwise). A position reached rarely, or never, drifts toward its predecessor's rate
        as its counts decay, so it is tried again."""
        if not any(r > 1e-9 for r in self.profile_reached):
            return None
        m, rates = self.prior_strength, []
        for i in range(max(depth, 1)):
            reached = self.profile_reached[i] if i < len(self.profile_reached) else 0.0
            accepted = self.profile_accepted[i] if i < len(self.profile_accepted) else 0.0
            if not rates:
                rate = accepted / reached if reached > 1e-9 else 0.0
            else:
                rate = min((accepted + m * rates[-1]) / (reached + m), rates[-1])
            rates.append(rate)
        return rates[:depth]

    def difficulty(self) -> float:
        """Recent accepts over those the profile predicts at the positions reached lately (1: as usual)."""
        # the measured long-run rates, unshrunk: the recent counts are compared with what was measured
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
            reached = self.own_reached[i] if i < len(self.own_reached) else 0.0
            accepted = self.own_accepted[i] if i < len(self.own_accepted) else 0.0
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
