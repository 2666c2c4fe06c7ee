"""The benchmarks' phase timer: it listens to the workers' `PhaseClock` (the clock adaptive speculation
reads), so a benchmark times exactly the phases the engine times, and (eager runs) it files every
projection GEMM under the phase it ran in, to replay them alone afterwards: the phase's floor.

Phases: plain decoding `decode` / `prefill` (the forward) and `sample`; speculative decoding `catch_up`,
`draft`, `verify` (verify forward, acceptance, commit), `extend` and `host` (the host's work between
two iterations). A prefill of speculative decoding runs outside the clock."""

import time
from collections import defaultdict

import torch

from eyas.engine.models.fused_linear import FusedLinear


class GemmRecorder:
    """Records every projection GEMM (a FusedLinear call, or an nn.Linear one for models that run their
    modules one by one) with its shapes; `file(phase)` files the calls since the last filing under the
    phase, and `floor(phase, count)` replays that phase's calls alone: seconds per phase count."""

    def __init__(self):
        self.calls = defaultdict(list)
        self.pending: list[tuple] = []
        self._fused = FusedLinear.__call__
        self._linear = torch.nn.Linear.forward

    def __enter__(self):
        recorder, fused, linear = self, self._fused, self._linear

        def record_fused(proj, x, residual=None):
            recorder.pending.append((proj, x.shape[0], x.shape[1], residual is not None, x.dtype))
            return fused(proj, x, residual)

        def record_linear(module, x):
            recorder.pending.append((module, x.numel() // x.shape[-1], x.shape[-1], False, x.dtype))
            return linear(module, x)

        FusedLinear.__call__, torch.nn.Linear.forward = record_fused, record_linear
        return self

    def __exit__(self, *exc):
        FusedLinear.__call__, torch.nn.Linear.forward = self._fused, self._linear

    def file(self, phase: str | None) -> None:
        if phase is not None:
            self.calls[phase] += self.pending
        self.pending = []

    def clear(self) -> None:
        self.calls.clear()
        self.pending = []

    def _run(self, proj, x, residual):
        if isinstance(proj, torch.nn.Linear):
            return self._linear(proj, x)
        return self._fused(proj, x, residual)

    @torch.inference_mode()
    def floor(self, phase: str, count: int) -> float:
        calls = self.calls.get(phase)
        if not calls or not count:
            return float("nan")
        dtype = calls[0][-1]  # the inputs' (a weight in a kernel's own layout has no dense tensor to ask)
        inputs = {(rows, width): torch.randn(rows, width, dtype=dtype) for _, rows, width, _, _ in calls}
        residuals = {(rows, c.out_features): torch.randn(rows, c.out_features, dtype=dtype)
                     for c, rows, _, has, _ in calls if has}
        replay = [(c, inputs[rows, width], residuals[rows, c.out_features] if has else None)
                  for c, rows, width, has, _ in calls]
        for c, x, r in replay[: min(len(replay), 200)]:  # warm up
            self._run(c, x, r)
        start = time.perf_counter()
        for c, x, r in replay:
            self._run(c, x, r)
        return (time.perf_counter() - start) / count


class PhaseTimer:
    """A `PhaseListener`: total seconds and count per phase over the iterations it heard, and (with a
    GEMM recorder: eager runs only, a GEMM inside a compiled graph cannot be recorded) each phase's floor."""

    def __init__(self, gemms: GemmRecorder | None = None):
        self.total: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self.gemms = gemms

    def attach(self, engine) -> "PhaseTimer":
        engine.worker.phase_listeners.append(self)
        return self

    def start(self) -> None:
        if self.gemms is not None:
            self.gemms.file(None)  # a prefill's GEMMs, run between iterations

    def lap(self, phase: str, seconds: float) -> None:
        self.total[phase] += seconds
        self.count[phase] += 1
        if self.gemms is not None:
            self.gemms.file(phase)

    def clear(self) -> None:
        self.total.clear()
        self.count.clear()
        if self.gemms is not None:
            self.gemms.clear()

    def mean(self, phase: str) -> float:
        n = self.count[phase]
        return self.total[phase] / n if n else float("nan")

    def floor(self, phase: str) -> float:
        return float("nan") if self.gemms is None else self.gemms.floor(phase, self.count[phase])
