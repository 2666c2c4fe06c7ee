"""Wall time of each phase of one speculative iteration, for adaptive speculation's cost model."""

import time

import torch

# the phase of an iteration that catches the head up on cycles it sat out: a cost of the switch back
# to drafting with it, which an adaptive policy keeps out of the cost of the candidate it switched to
CATCH_UP_PHASE = "catch_up"


class PhaseClock:
    """Seconds per phase of one iteration (synchronised on CUDA when `sync`)."""

    def __init__(self, device: torch.device, sync: bool):
        self.cuda = sync and torch.device(device).type == "cuda"
        self.times: dict[str, float] = {}
        self._last = self._now()

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self, phase: str) -> None:
        now = self._now()
        self.times[phase] = now - self._last
        self._last = now
