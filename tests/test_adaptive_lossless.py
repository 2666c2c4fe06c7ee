"""Adaptive speculation is lossless: greedy output equals plain decoding while the step count changes
under the running batch, and the shipped policies run end to end."""

import pytest
from dependency_injector import providers

from conftest import PLAIN, spec_overrides
from containers.build import build_container
from containers.compose import compose_config
from engine import SamplingParams, build_engine

PROMPTS = ["def add(a, b):", "import os", "class Point:\n    def __init__(self, x, y):", "for", "x = [1, 2, 3]"]
# unequal lengths: the batch shrinks 5 -> 1 as requests finish, crossing tiers
PARAMS = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (30, 12, 22, 6, 26)]
TIERS = "adaptive.tiers=[{batch_size:2,candidates:[0,1,3,5]},{batch_size:8,candidates:[0,2,4]}]"


class CyclingPolicy:
    """Test policy: a different candidate every `every` cycles of its tier (walks the candidates up and down)."""

    needs_timings = False

    def __init__(self, candidates, initial, every=1):
        self.order = list(candidates) + list(reversed(candidates[1:-1]))
        self.every = every
        self.cycles = 0

    @property
    def steps(self) -> int:
        return self.order[(self.cycles // self.every) % len(self.order)]

    def observe(self, num_steps, accepted_drafts, timings):
        assert num_steps == self.steps and all(0 <= n <= num_steps for n in accepted_drafts)
        self.cycles += 1


@pytest.fixture(scope="module")
def plain_outputs(spec_pair):
    target, _ = spec_pair
    with build_engine([*PLAIN, f"model.path={target}"]) as eng:
        return [o.token_ids for o in eng.generate(PROMPTS, PARAMS)]


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_forced_switching_equals_plain(spec_pair, plain_outputs, kind, page_size):
    target, heads = spec_pair
    config = compose_config([*spec_overrides(target, heads[kind], kind, 3, f"cache.page_size={page_size}"),
                             "adaptive=ema", TIERS])
    container = build_container(config)
    container.make_policy.override(providers.Object(CyclingPolicy))
    engine = container.engine()
    outs = engine.generate(PROMPTS, PARAMS)
    metrics = engine.metrics()
    assert [o.token_ids for o in outs] == plain_outputs
    assert engine.scheduler.kv.all_free()
    # the batch shrinks from 5 (tier 8) to 1-2 (tier 2) as requests finish: both tiers ran
    assert set(metrics["adaptive_cycles_at_steps"]) == {0, 1, 2, 3, 4, 5}
    assert metrics["adaptive_switches"] >= 8


@pytest.mark.parametrize("policy", ["ema", "throughput"])
def test_shipped_policies_are_lossless(spec_pair, plain_outputs, policy):
    target, heads = spec_pair
    overrides = [*spec_overrides(target, heads["eagle"], "eagle", 3), f"adaptive={policy}", TIERS,
                 "adaptive.update_interval=2", "adaptive.warmup_batches=2", "adaptive.probe_interval=2"]
    with build_engine(overrides) as eng:
        outs = eng.generate(PROMPTS, PARAMS)
        metrics = eng.metrics()
    assert [o.token_ids for o in outs] == plain_outputs
    assert metrics["adaptive_switches"] >= 1


def test_adaptive_sampling_runs_and_is_seeded(spec_pair):
    target, heads = spec_pair
    overrides = [*spec_overrides(target, heads["eagle3"], "eagle3", 3), "adaptive=throughput", TIERS,
                 "adaptive.update_interval=2"]
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=11, ignore_eos=True)
    runs = []
    for _ in range(2):
        with build_engine(overrides) as eng:
            runs.append([o.token_ids for o in eng.generate(PROMPTS[:3], params)])
            assert eng.metrics()["adaptive_switches"] >= 1
    assert runs[0] == runs[1] and all(len(t) == 24 for t in runs[0])
