"""The `ema` policy: follow an exponential moving average of accepted drafts per cycle.

Per tier. After `warmup_batches` cycles, every `update_interval` cycles: walk down while
ema <= prev - 0.5 + down_hysteresis (0.5 when the lower candidate is 0), else walk up while
ema > cur - 0.5 + up_hysteresis, over the tier's step counts (chains of the configured drafter). At 0 steps nothing is drafted, so nothing is measured: the policy
probes the next candidate (with a fresh average).
"""


from eyas.engine.speculative.candidate import Candidate


class EmaPolicy:
    needs_timings = False

    def __init__(self, candidates: tuple[Candidate, ...], initial: Candidate, ema_alpha: float, update_interval: int,
                 warmup_batches: int, down_hysteresis: float, up_hysteresis: float):
        self.candidates = candidates
        self.index = candidates.index(initial)
        self.alpha = ema_alpha
        self.update_interval = update_interval
        self.warmup_batches = warmup_batches
        self.down_hysteresis = down_hysteresis
        self.up_hysteresis = up_hysteresis
        self.ema: float | None = None
        self.cycles = 0

    @property
    def choice(self) -> Candidate:
        return self.candidates[self.index]

    @property
    def _steps(self) -> int:
        return self.choice.num_steps

    def observe(self, candidate: Candidate, accepted_drafts: list[int], timings: dict) -> None:
        if candidate.num_steps > 0 and accepted_drafts:
            x = sum(accepted_drafts) / len(accepted_drafts)
            self.ema = x if self.ema is None else self.alpha * x + (1 - self.alpha) * self.ema
        self.cycles += 1
        after_warmup = self.cycles - self.warmup_batches
        if after_warmup >= 0 and after_warmup % self.update_interval == 0:
            self._update()

    def _down_threshold(self) -> float:
        lower = self.candidates[self.index - 1].num_steps
        return 0.5 if lower == 0 else lower - 0.5 + self.down_hysteresis

    def _update(self) -> None:
        if self._steps == 0:
            if self.index + 1 < len(self.candidates):
                self.index += 1
                self.ema = None
            return
        if self.ema is None:
            return
        moved_down = False
        while self.index > 0 and self.ema <= self._down_threshold():
            self.index -= 1
            moved_down = True
        if moved_down:
            return
        while self.index + 1 < len(self.candidates) and self.ema > self._steps - 0.5 + self.up_hysteresis:
            self.index += 1
