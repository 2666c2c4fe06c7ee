"""Decayed per-position acceptance statistics, shared by every tier (acceptance depends on the text,
not on the batch size).

Position i (1-based) is *reached* in a cycle when it was drafted and every draft before it was
accepted. The conditional rate a_i = accepted_i / reached_i; the expected number of accepted drafts
with k steps is sum_{i<=k} prod_{j<=i} a_j. The rates used are made non-increasing with depth (a
deeper position is assumed no easier than a shallower one): positions not drafted lately keep the
rates of the text they were last measured on, and this keeps a stale deep rate from outbidding
what the fresh shallow ones say. Positions never reached take the deepest measured rate.
"""


class AcceptanceModel:
    def __init__(self, decay: float):
        self.decay = decay  # per cycle, applied to every count
        self.reached: list[float] = []
        self.accepted: list[float] = []

    def observe(self, num_steps: int, accepted_drafts: list[int]) -> None:
        if num_steps == 0 or not accepted_drafts:
            return
        if len(self.reached) < num_steps:
            grow = num_steps - len(self.reached)
            self.reached.extend([0.0] * grow)
            self.accepted.extend([0.0] * grow)
        self.reached = [r * self.decay for r in self.reached]
        self.accepted = [a * self.decay for a in self.accepted]
        for n in accepted_drafts:
            for i in range(min(n + 1, num_steps)):
                self.reached[i] += 1.0
            for i in range(n):
                self.accepted[i] += 1.0

    def conditional_rates(self, depth: int) -> list[float] | None:
        """a_1..a_depth, or None before any draft was measured."""
        rates = [a / r for a, r in zip(self.accepted, self.reached) if r > 1e-9]
        if not rates:
            return None
        for i in range(1, len(rates)):
            rates[i] = min(rates[i], rates[i - 1])
        return [rates[min(i, len(rates) - 1)] for i in range(depth)]

    def expected_accepted(self, num_steps: int) -> float | None:
        rates = self.conditional_rates(num_steps)
        if rates is None:
            return None if num_steps else 0.0
        total, survive = 0.0, 1.0
        for a in rates:
            survive *= a
            total += survive
        return total
