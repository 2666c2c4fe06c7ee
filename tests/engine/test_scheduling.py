"""KV accounting and admission: a small pool, many requests, exact bookkeeping, no lost work."""

import random

import pytest
from support import build_engine
from support.engines import engine_overrides

from eyas import SamplingParams


def test_200_random_requests_through_a_small_pool_all_finish_and_free_every_slot(gqa_checkpoint):
    rng = random.Random(0)
    prompts, params = [], []
    for i in range(200):
        prompts.append([0] + [rng.randrange(2, 320) for _ in range(rng.randrange(1, 40))])
        params.append(SamplingParams(
            max_new_tokens=rng.randrange(1, 30), temperature=rng.choice([0.0, 1.0]), seed=i,
            stop=rng.choice([[], ["e"], ["\n"]]), ignore_eos=rng.random() < 0.5,
        ))
    total = sum(len(p) + s.max_new_tokens for p, s in zip(prompts, params))
    with build_engine(engine_overrides(gqa_checkpoint, "none", "cache.page_size=16", "cache.max_total_tokens=512",
                                       "cache.max_running_requests=12")) as eng:
        kv = eng.scheduler.kv
        assert kv.capacity_tokens < total / 5
        outs = eng.generate(prompt_token_ids=prompts, sampling=params)
        assert all(o.finish_reason in ("stop", "length") for o in outs), [o.error for o in outs if o.error]
        assert all(1 <= len(o.token_ids) <= p.max_new_tokens for o, p in zip(outs, params))
        assert any(o.finish_reason == "stop" for o in outs) and any(o.finish_reason == "length" for o in outs)
        assert kv.all_free()
        kv.clear_cache()  # the prefix cache gives back every page it kept
        assert kv.allocator.num_free_pages == kv.allocator.num_pages and kv.cached_pages == 0
        assert (kv.table.table == -1).all()


def test_waiting_requests_run_later_with_the_same_output(gqa_checkpoint):
    prompts = [[0] + list(range(5, 5 + n)) for n in (3, 9, 14, 6, 11, 2)]
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    with build_engine(engine_overrides(gqa_checkpoint, "none", "cache.max_total_tokens=4096")) as eng:
        roomy = [o.token_ids for o in eng.generate(prompt_token_ids=prompts, sampling=params)]
    # two requests at a time: the rest wait in the queue
    with build_engine(engine_overrides(gqa_checkpoint, "none", "cache.max_running_requests=2")) as eng:
        queued = eng.generate(prompt_token_ids=prompts, sampling=params)
        assert eng.metrics()["forward_steps"] >= 3 * 20
        assert eng.scheduler.kv.all_free()
    assert [o.token_ids for o in queued] == roomy


@pytest.mark.parametrize("speculative", [False, True])
def test_requests_preempted_when_the_pool_runs_short_finish_with_the_same_output(spec_pair, speculative):
    """KV grows with each request; when the pool runs out the newest request gives its KV back and
    prefills prompt + output again later. Greedy and seeded sampled outputs are unchanged."""
    target, heads = spec_pair
    prompts = [[0] + list(range(5, 5 + n)) for n in (3, 9, 14, 6, 11, 2, 7, 5)]
    params = [SamplingParams(max_new_tokens=40, ignore_eos=True, temperature=t, seed=i)
              for i, t in enumerate([0.0, 1.0] * 4)]
    base = engine_overrides(target, "eagle3", head=heads["eagle3"]) if speculative else engine_overrides(target)
    with build_engine([*base, "cache.max_total_tokens=4096"]) as eng:
        roomy = [o.token_ids for o in eng.generate(prompt_token_ids=prompts, sampling=params)]
        assert eng.metrics()["preemptions"] == 0
    # 8 tokens a page, 24 pages: all 8 prompts fit at once, their full sequences do not
    with build_engine([*base, "cache.page_size=8", "cache.max_total_tokens=192"]) as eng:
        tight = eng.generate(prompt_token_ids=prompts, sampling=params)
        assert eng.metrics()["preemptions"] > 0
        assert eng.scheduler.kv.all_free()
    assert [o.token_ids for o in tight] == roomy


def test_request_that_can_never_fit_fails_alone(gqa_checkpoint):
    prompts = [[0, 5, 6], [0] + list(range(2, 200)), [0, 7, 8, 9]]
    params = [SamplingParams(max_new_tokens=8, ignore_eos=True), SamplingParams(max_new_tokens=100, ignore_eos=True),
              SamplingParams(max_new_tokens=8, ignore_eos=True)]
    with build_engine(engine_overrides(gqa_checkpoint, "none", "cache.page_size=16", "cache.max_total_tokens=256")) as eng:
        outs = eng.generate(prompt_token_ids=prompts, sampling=params)
        assert eng.scheduler.kv.all_free()
    assert outs[1].finish_reason == "error" and "cache.max_total_tokens" in outs[1].error
    assert [len(o.token_ids) for o in (outs[0], outs[2])] == [8, 8]


def test_prompt_longer_than_context_and_empty_prompt_fail_alone(gqa_checkpoint):
    with build_engine(engine_overrides(gqa_checkpoint, "none", "cache.max_context_len=32")) as eng:
        outs = eng.generate(prompt_token_ids=[[0] * 40, [], [0, 5]],
                            sampling=SamplingParams(max_new_tokens=50, ignore_eos=True))
    assert outs[0].finish_reason == "error" and "cache.max_context_len" in outs[0].error
    assert outs[1].finish_reason == "error" and "empty prompt" in outs[1].error
    # generation stops at the context length
    assert outs[2].finish_reason == "length" and len(outs[2].token_ids) == 30
