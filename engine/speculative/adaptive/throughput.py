"""The `throughput` policy: choose the step count with the highest estimated tokens per second.

Per tier, from measured figures only: the expected tokens per request per cycle at k steps,
1 + E[accepted drafts | k], comes from the shared per-position acceptance model; the time of a cycle
at k steps (draft + verify at width k + 1 + draft-extend) is an exponential moving average measured
while running at k. Estimated rate(k) = (1 + E[accepted | k]) / t_cycle(k).

It first runs `update_interval` cycles at each candidate (so every cost is measured), then every
`update_interval` cycles takes the best estimate. Every `probe_interval` updates it spends one
interval at a neighbour of the best candidate (alternately above and below), which refreshes that
neighbour's cost and the acceptance of deeper positions.
"""

from engine.speculative.adaptive.acceptance import AcceptanceModel


class ThroughputPolicy:
    needs_timings = True

    def __init__(self, candidates: tuple[int, ...], initial: int, acceptance: AcceptanceModel, ema_alpha: float,
                 update_interval: int, probe_interval: int):
        self.candidates = candidates
        self.acceptance = acceptance
        self.alpha = ema_alpha
        self.update_interval = update_interval
        self.probe_interval = probe_interval
        start = candidates.index(initial)
        self._explore = list(candidates[start:]) + list(reversed(candidates[:start]))  # initial first
        self.index = start
        self.best = initial
        self.cycle_time: dict[int, float] = {}  # k -> seconds per cycle
        self.cycles = 0
        self.updates = 0
        self._probe_up = True

    @property
    def steps(self) -> int:
        return self.candidates[self.index]

    def observe(self, num_steps: int, accepted_drafts: list[int], timings: dict) -> None:
        self.acceptance.observe(num_steps, accepted_drafts)
        t = sum(timings.values())
        old = self.cycle_time.get(num_steps)
        self.cycle_time[num_steps] = t if old is None else self.alpha * t + (1 - self.alpha) * old
        self.cycles += 1
        if self.cycles % self.update_interval == 0:
            self._update()

    def estimated_rate(self, k: int) -> float | None:
        """Tokens per request per second at k steps, or None while unmeasured."""
        accepted = self.acceptance.expected_accepted(k)
        t = self.cycle_time.get(k)
        if accepted is None or t is None or t <= 0:
            return None
        return (1.0 + accepted) / t

    def _update(self) -> None:
        if self._explore:
            self._explore.pop(0)
            if self._explore:
                self.index = self.candidates.index(self._explore[0])
                return
        self.updates += 1
        rates = {k: self.estimated_rate(k) for k in self.candidates}
        known = {k: r for k, r in rates.items() if r is not None}
        if known:
            self.best = max(known, key=known.get)
        choice = self.best
        if self.probe_interval and self.updates % self.probe_interval == 0 and len(self.candidates) > 1:
            choice = self._neighbour(self.best)
        self.index = self.candidates.index(choice)

    def _neighbour(self, k: int) -> int:
        i = self.candidates.index(k)
        up = i + 1 < len(self.candidates)
        down = i > 0
        go_up = up and (self._probe_up or not down)
        self._probe_up = not self._probe_up
        return self.candidates[i + 1] if go_up else self.candidates[i - 1]
