"""The `throughput` policy: choose the step count with the highest estimated tokens per second.

Per tier, from measured figures only: the expected tokens per request per cycle at k steps,
1 + E[accepted drafts | k], comes from the shared acceptance model (`acceptance.py`: every cycle
informs every depth); the seconds per cycle at k and the current batch size come from the tier's
cost model (`cycle_cost.py`: one line in k fitted from every measured k). Estimated rate(k) =
(1 + E[accepted | k]) / t(k, b).

It first runs `update_interval` cycles at each candidate, skipping one that the measurements so far
already estimate more than `PROBE_MARGIN` below the best (so a costly deep k need not be tried), then every
`update_interval` cycles takes the best estimate. Every `probe_interval` updates it spends one
interval at a neighbour of the best candidate (alternately above and below) whose estimate is within
`PROBE_MARGIN` of the best, which refreshes the acceptance of a deeper position or the cost of a
neighbour; a neighbour estimated far worse is not worth an interval. The state lives as long as the
engine: later `generate` calls start from what earlier ones measured.
"""

from engine.speculative.adaptive.acceptance import AcceptanceModel
from engine.speculative.adaptive.cycle_cost import CycleCostModel


PROBE_MARGIN = 0.1  # probe a neighbour estimated at >= (1 - margin) x the best rate


class ThroughputPolicy:
    needs_timings = True

    def __init__(self, candidates: tuple[int, ...], initial: int, acceptance: AcceptanceModel, ema_alpha: float,
                 update_interval: int, probe_interval: int):
        self.candidates = candidates
        self.acceptance = acceptance
        self.update_interval = update_interval
        self.probe_interval = probe_interval
        start = candidates.index(initial)
        # initial first, then outwards, the nearer step count below first: two measured step counts >= 1
        # give the cost line, which estimates the rest before they are run
        self._explore = sorted(candidates, key=lambda k: (abs(k - initial), k))
        self.index = start
        self.best = initial
        self.costs = CycleCostModel(ema_alpha)
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
        self.costs.observe(num_steps, self.batch_size, sum(timings.values()))
        self.cycles += 1
        if self.cycles % self.update_interval == 0:
            self._update()

    def cycle_seconds(self, k: int, batch_size: int) -> float | None:
        return self.costs.seconds(k, batch_size)

    def estimated_rates(self) -> dict[int, float | None]:
        """Tokens per request per second of every candidate at the current batch size (None: unmeasured)."""
        expected = self.acceptance.expected_accepted(max(self.candidates))  # [k]: accepted drafts at k steps
        out = {}
        for k in self.candidates:
            t = self.cycle_seconds(k, self.batch_size)
            known = k == 0 or expected is not None
            out[k] = (1.0 + expected[k]) / t if known and t is not None and t > 0 else None
        return out

    def _update(self) -> None:
        if self._explore:
            self._explore.pop(0)
            while self._explore and self._not_worth_exploring(self._explore[0]):
                self._explore.pop(0)
            if self._explore:
                self.index = self.candidates.index(self._explore[0])
                return
        self.updates += 1
        rates = self.estimated_rates()
        known = {k: r for k, r in rates.items() if r is not None}
        if known:
            self.best = max(known, key=known.get)
        choice = self.best
        if self.probe_interval and self.updates % self.probe_interval == 0:
            choice = self._probe(rates) or self.best
        self.index = self.candidates.index(choice)

    def _not_worth_exploring(self, k: int) -> bool:
        """Already estimated (from the cost line and the acceptance of other step counts) far below the
        best estimate: running it would cost more than it could tell."""
        rates = self.estimated_rates()
        known = [r for r in rates.values() if r is not None]
        return rates[k] is not None and rates[k] < (1 - PROBE_MARGIN) * max(known)

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
