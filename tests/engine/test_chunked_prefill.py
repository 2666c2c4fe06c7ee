"""Chunked prefill: a prompt longer than `cache.max_prefill_tokens` is computed a chunk per step while
running requests go on decoding, with the same outputs and the same acceptance as in one piece."""

import random

import pytest
from support import build_engine
from support.engines import DRAFTER_CASES, draft_head, engine_overrides

from eyas import SamplingParams


@pytest.mark.parametrize("algorithm, shape", DRAFTER_CASES, ids=[c[0] for c in DRAFTER_CASES])
def test_chunks_change_no_output_and_no_acceptance(spec_pair, algorithm, shape):
    target, heads = spec_pair
    head = draft_head(algorithm, target, heads)
    rng = random.Random(5)
    prompts = [[0] + [rng.randrange(2, 320) for _ in range(n)] for n in (60, 3, 45, 17, 90)]
    params = [SamplingParams(max_new_tokens=10, ignore_eos=True, temperature=t, seed=i)
              for i, t in enumerate([0.0, 0.8, 0.0, 0.0, 0.8])]
    runs = []
    for budget in (2048, 13):
        overrides = engine_overrides(target, algorithm, "cache.page_size=4", f"cache.max_prefill_tokens={budget}",
                                     head=head, **shape)
        with build_engine(overrides) as eng:
            outs = eng.generate(prompt_token_ids=prompts[:2], sampling=params[:2])  # some cached prefixes below
            outs += eng.generate(prompt_token_ids=[p + [7, 8] for p in prompts], sampling=params)
            steps = eng.metrics()["forward_steps"]
            assert eng.scheduler.kv.all_free()
        runs.append(([o.token_ids for o in outs], [o.stats.get("num_verify_cycles") for o in outs],
                     [o.stats.get("mean_accept_length") for o in outs], steps))
    assert runs[0][0] == runs[1][0]
    if algorithm != "suffix":  # suffix decoding drafts from other requests' streams, which chunks open later
        assert runs[0][1:3] == runs[1][1:3]
    assert runs[1][3] > runs[0][3]  # the chunks took steps of their own


def test_a_long_prompt_stalls_no_running_stream(spec_pair):
    """While a long prompt prefills a chunk per step, a running request gets its tokens every step."""
    target, heads = spec_pair
    overrides = engine_overrides(target, "eagle", "cache.max_prefill_tokens=16", head=heads["eagle"])
    with build_engine(overrides) as eng:
        short = eng.submit(prompt_token_ids=[[0, 5, 6, 7]], sampling=SamplingParams(max_new_tokens=60, ignore_eos=True))[0]
        eng.step()
        long = eng.submit(prompt_token_ids=[[0] + list(range(10, 110))],
                          sampling=SamplingParams(max_new_tokens=4, ignore_eos=True))[0]
        chunks = 0
        while not long.output_ids:
            before = len(short.output_ids)
            eng.step()
            chunks += 1
            assert len(short.output_ids) > before  # decoded in the same step as the chunk
        assert chunks == 7  # 101 tokens, 16 a step
        while eng.has_work():
            eng.step()
        assert eng.scheduler.kv.all_free()
