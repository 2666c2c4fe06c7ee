"""The `throughput` policy: choose the step count with the highest estimated tokens per second.

Per tier, from measured figures only: the expected tokens per request per cycle at k steps,
1 + E[accepted drafts | k], comes from the shared per-position acceptance model; the time of a cycle
at k steps and batch size b (draft + verify at width k + 1 + draft-extend) is an exponential moving
average measured while running at k with b requests. Estimated rate(k) = (1 + E[accepted | k]) /
t_cycle(k, b) at the current batch size b; when k was measured only at other batch sizes, its time
at the nearest one is scaled by b / b'.

It first runs `update_interval` cycles at each candidate (so every cost is measured), then every
`update_interval` cycles takes the best estimate. Every `probe_interval` updates it spends one
interval at a neighbour of the best candidate (alternately above and below) whose estimate is within
`PROBE_MARGIN` of the best, which refreshes that neighbour's cost and, above, the acceptance of deeper
positions; a neighbour estimated far worse is not worth an interval.
"""

from engine.speculative.adaptive.acceptance import AcceptanceModel


PROBE_MARGIN = 0.1  # probe a neighbour estimated at >= (1 - margin) x the best rate


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
        self.cycle_time: dict[tuple[int, int], float] = {}  # (k, batch size) -> seconds per cycle
        self.batch_size = 1  # of the last cycle
        self.cycles = 0
        self.updates = 0
        self._probe_up = True

    @property
    def steps(self) -> int:
        return self.candidates[self.index]

    def observe(self, num_steps: int, accepted_drafts: list[int], timings: dict) -> None:
        self.acceptance.observe(num_steps, accepted_drafts)
        self.batch_size = max(len(accepted_drafts), 1)
        key = (num_steps, self.batch_size)
        t = sum(timings.values())
        old = self.cycle_time.get(key)
        self.cycle_time[key] = t if old is None else self.alpha * t + (1 - self.alpha) * old
        self.cycles += 1
        if self.cycles % self.update_interval == 0:
            self._update()

    def cycle_seconds(self, k: int, batch_size: int) -> float | None:
        """Measured time of a cycle at k steps and this batch size (scaled from the nearest measured one)."""
        sizes = [b for kk, b in self.cycle_time if kk == k]
        if not sizes:
            return None
        nearest = min(sizes, key=lambda b: (abs(b - batch_size), b))
        return self.cycle_time[(k, nearest)] * batch_size / nearest

    def estimated_rate(self, k: int) -> float | None:
        """Tokens per request per second at k steps and the current batch size, or None while unmeasured."""
        accepted = self.acceptance.expected_accepted(k)
        t = self.cycle_seconds(k, self.batch_size)
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
        if self.probe_interval and self.updates % self.probe_interval == 0:
            choice = self._probe(rates) or self.best
        self.index = self.candidates.index(choice)

    def _probe(self, rates: dict) -> int | None:
        """A neighbour of the best worth an interval (unmeasured, or estimated close to the best)."""
        i = self.candidates.index(self.best)
        below = [self.candidates[i - 1]] if i > 0 else []
        above = [self.candidates[i + 1]] if i + 1 < len(self.candidates) else []
        order = above + below if self._probe_up else below + above
        self._probe_up = not self._probe_up
        floor = (1 - PROBE_MARGIN) * (rates[self.best] or 0.0)
        for k in order:
            if rates[k] is None or rates[k] >= floor:
                return k
        return None
