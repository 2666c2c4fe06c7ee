"""Wall time of each phase of one decode iteration: adaptive speculation's cost model reads it, and
listeners (a benchmark's phase timer) hear each lap as it ends."""

import time
from typing import Protocol

import torch

# the phase of an iteration that catches the head up on cycles it sat out: a cost of the switch back
# to drafting with it, which an adaptive policy keeps out of the cost of the candidate it switched to
CATCH_UP_PHASE = "catch_up"
# the host's work between one decode iteration and the next (scheduling, stop checks, caching): a cost
# of every cycle alike, which leaves out of a cycle's time would make short chains look cheaper than they are
HOST_PHASE = "host"


class PhaseListener(Protocol):
    def start(self) -> None:
        """An iteration starts: work done since the last lap belongs to no phase."""

    def lap(self, phase: str, seconds: float) -> None:
        """`phase` ended, `seconds` after the previous lap (or the start)."""


class PhaseClock:
    """Seconds per phase of one iteration (synchronised on CUDA when `sync` or when anyone listens)."""

    def __init__(self, device: torch.device, sync: bool, listeners: list[PhaseListener] = ()):
        self.listeners = listeners
        self.cuda = (sync or bool(listeners)) and torch.device(device).type == "cuda"
        self.times: dict[str, float] = {}
        for listener in listeners:
            listener.start()
        self._last = self.started = self._now()

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def add_gap(self, since: float | None) -> None:
        """The time from `since` (the previous iteration's end) to this one's start, as `HOST_PHASE`,
        when it is no longer than the iteration itself (longer: a pause between calls, not overhead)."""
        if since is not None:
            gap = self.started - since
            if 0 <= gap <= sum(self.times.values()):
                self.times[HOST_PHASE] = gap
                for listener in self.listeners:
                    listener.lap(HOST_PHASE, gap)

    def lap(self, phase: str) -> None:
        now = self._now()
        self.times[phase] = now - self._last
        self._last = now
        for listener in self.listeners:
            listener.lap(phase, self.times[phase])
