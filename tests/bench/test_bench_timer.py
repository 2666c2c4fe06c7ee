"""The benchmarks' phase timer hears the phases the workers' clock times: one lap per phase per step, plain
and speculative, and every projection GEMM filed under the phase that ran it."""

import math

from support import build_engine
from support.engines import engine_overrides

from eyas import SamplingParams
from eyas.bench.timer import GemmRecorder, PhaseTimer

PROMPT = "def add(a, b):"
NEW_TOKENS = 12


def timed_run(overrides: list[str]) -> tuple[PhaseTimer, dict]:
    with build_engine(overrides) as eng, GemmRecorder() as gemms:
        timer = PhaseTimer(gemms).attach(eng)
        out = eng.generate([PROMPT], SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True))[0]
        floors = {phase: timer.floor(phase) for phase in list(timer.count)}
    return timer, out.stats | {"floors": floors}


def test_plain_decoding_laps_each_step_once(checkpoint):
    timer, stats = timed_run(engine_overrides(checkpoint("bigram"), "none"))
    assert stats["generated_tokens"] == NEW_TOKENS
    assert timer.count["prefill"] == 1 and timer.count["decode"] == NEW_TOKENS - 1
    assert timer.count["sample"] == NEW_TOKENS  # the prefill's first token, then one per decode step
    assert all(timer.mean(phase) > 0 for phase in ("prefill", "decode", "sample"))
    assert stats["floors"]["decode"] > 0 and math.isnan(stats["floors"]["sample"])  # sampling runs no GEMM


def test_speculative_decoding_laps_each_phase_once_per_verify_cycle(spec_pair):
    target, heads = spec_pair
    timer, stats = timed_run(engine_overrides(target, "eagle3", head=heads["eagle3"], num_steps=3))
    cycles = stats["num_verify_cycles"]
    assert cycles > 0 and stats["generated_tokens"] == NEW_TOKENS
    assert timer.count["draft"] == timer.count["verify"] == timer.count["extend"] == cycles
    assert timer.count["host"] <= cycles - 1  # the gap before each cycle but the first
    assert all(stats["floors"][phase] > 0 for phase in ("draft", "verify", "extend"))
    assert math.isnan(timer.mean("never_ran"))
