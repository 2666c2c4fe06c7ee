"""Adaptive speculation is lossless: greedy output equals plain decoding while the step count changes
under the running batch, and the shipped policies run end to end."""

import pytest
import torch
from dependency_injector import providers

from conftest import plain_token_ids, spec_overrides
from containers.build import build_container
from containers.compose import compose_config
from engine import SamplingParams, build_engine
from engine.request import Request

PROMPTS = ["def add(a, b):", "import os", "class Point:\n    def __init__(self, x, y):", "for", "x = [1, 2, 3]"]
# unequal lengths: the batch shrinks 5 -> 1 as requests finish, crossing tiers
PARAMS = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (60, 24, 44, 12, 52)]
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
    return plain_token_ids(spec_pair[0], PROMPTS, PARAMS)


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


def test_held_draft_extend_equals_running_it_every_iteration(spec_pair):
    """What 0 steps holds back and replays in one forward leaves the draft KV and the next proposal as
    running draft-extend after every iteration would."""
    target, heads = spec_pair
    results = []
    for replay in (False, True):
        with build_engine(spec_overrides(target, heads["eagle3"], "eagle3", 3)) as eng:
            worker = eng.worker
            draft = worker.draft_worker
            request = Request(0, [0, 5, 9, 14, 3], SamplingParams(max_new_tokens=8))
            eng.scheduler.add(request)
            (req,) = eng.scheduler.schedule()
            worker.prefill([req])
            row, n = req.row, req.num_computed
            gen = torch.Generator().manual_seed(0)
            hidden = draft.model.config.hidden_size
            steps = [([int(t)], torch.randn(1, hidden, generator=gen)) for t in torch.randint(0, 200, (4,), generator=gen)]
            for i, (tokens, features) in enumerate(steps):
                if replay:
                    worker.deferred.hold([row], [n + i], [tokens], features)
                else:
                    draft.forward_draft_extend([row], [n + i], [tokens], features)
            if replay:
                draft.forward_draft_extend(*worker.deferred.take([row]))
                assert len(worker.deferred) == 0
            slots = worker.req_to_token[row, : n + len(steps)]
            pool = draft.draft_runner.kv_pool
            results.append((pool.k[0][slots].clone(), pool.v[0][slots].clone(),
                            *[t.clone() for t in draft.buffers.load(torch.tensor([row]))]))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
