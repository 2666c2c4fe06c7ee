"""A seeded sampled request emits the same tokens whatever runs it: plain decoding, any step count,
either draft head, either draft sampling mode, adaptive step schedules, alone or in any batch."""

import pytest
from support import build_engine
from support.engines import PROMPTS_16, engine_overrides

from eyas import SamplingParams

# temperature, top_k, top_p: every filter, several temperatures, and greedy requests in the same batch
SETTINGS = [(0.7, 0, 1.0), (1.0, 5, 1.0), (0.8, 0, 0.95), (1.3, 20, 0.9), (0.0, 0, 1.0), (1.0, 0, 1.0),
            (0.5, 3, 0.8), (0.9, 40, 1.0)]
PARAMS = [SamplingParams(max_new_tokens=20 + i % 3 * 6, temperature=t, top_k=k, top_p=p, seed=1000 + i,
                         ignore_eos=True)
          for i, (t, k, p) in enumerate(SETTINGS * 2)]
TIERS = "adaptive.tiers=[{batch_size:4,candidates:[1,3,5]},{batch_size:16,candidates:[0,2,4]}]"
BATCH = "cache.max_running_requests=16"  # the 16 requests run as one batch


def token_ids(overrides, prompts=PROMPTS_16, params=PARAMS) -> tuple[list[list[int]], dict]:
    with build_engine([*overrides, BATCH]) as eng:
        outs = eng.generate(prompts, params)
        assert eng.scheduler.kv.all_free()
        return [o.token_ids for o in outs], eng.metrics()


def test_plain_batch_of_16_equals_each_request_alone(spec_pair, plain_reference):
    target = spec_pair[0]
    plain = plain_reference(target, PROMPTS_16, PARAMS, BATCH)
    with build_engine(engine_overrides(target)) as eng:
        alone = [eng.generate([prompt], params)[0].token_ids for prompt, params in zip(PROMPTS_16, PARAMS)]
    assert alone == plain
    assert len({tuple(t) for t in plain}) == len(plain)  # really sampled: no two requests alike


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("num_steps", [1, pytest.param(2, marks=pytest.mark.slow), 3,  # 2, 4: -m slow
                                       pytest.param(4, marks=pytest.mark.slow), 5])
def test_speculative_equals_plain_for_every_step_count(spec_pair, plain_reference, kind, num_steps):
    target, heads = spec_pair
    plain = plain_reference(target, PROMPTS_16, PARAMS, BATCH)
    got, metrics = token_ids(engine_overrides(target, kind, head=heads[kind], num_steps=num_steps))
    assert got == plain
    assert 0 < metrics["draft_accept_rate"] < 1  # sampled drafts are accepted and rejected


@pytest.mark.parametrize("draft_sampling", ["greedy", "sample"])
def test_draft_sampling_mode_changes_speed_not_tokens(spec_pair, plain_reference, draft_sampling):
    target, heads = spec_pair
    plain = plain_reference(target, PROMPTS_16, PARAMS, BATCH)
    got, _ = token_ids(engine_overrides(target, "eagle3", f"speculative.draft_sampling={draft_sampling}",
                                        head=heads["eagle3"]))
    assert got == plain


@pytest.mark.parametrize("policy", ["ema", "throughput"])
def test_adaptive_schedules_equal_plain(spec_pair, plain_reference, policy):
    target, heads = spec_pair
    plain = plain_reference(target, PROMPTS_16, PARAMS, BATCH)
    got, metrics = token_ids(engine_overrides(target, "eagle", f"adaptive={policy}", TIERS, "adaptive.update_interval=2",
                                              "adaptive.warmup_batches=2", "adaptive.probe_interval=2", head=heads["eagle"]))
    assert got == plain
    assert metrics["adaptive_switches"] >= 1


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_speculative_request_does_not_depend_on_its_neighbours(spec_pair, plain_reference, kind):
    """Alone, with other neighbours, and in another batch position: the same tokens."""
    target, heads = spec_pair
    plain = plain_reference(target, PROMPTS_16, PARAMS, BATCH)
    with build_engine(engine_overrides(target, kind, head=heads[kind], num_steps=4)) as eng:
        for i in (0, 3, 6):
            alone = eng.generate([PROMPTS_16[i]], PARAMS[i])[0].token_ids
            others = [SamplingParams(max_new_tokens=n, temperature=1.0, seed=s, ignore_eos=True)
                      for n, s in ((5, 7), (30, None))]
            mixed = eng.generate([PROMPTS_16[5], PROMPTS_16[i], PROMPTS_16[9]], [others[0], PARAMS[i], others[1]])
            assert alone == mixed[1].token_ids == plain[i]


def test_unseeded_requests_follow_the_engine_seed(spec_pair):
    """Without a request seed the engine's `seed` decides: the same engine seed reproduces a run,
    another engine seed gives other tokens."""
    target, heads = spec_pair
    params = SamplingParams(max_new_tokens=16, temperature=1.0, ignore_eos=True)

    def run(seed, *overrides):
        return token_ids([*overrides, f"seed={seed}"], PROMPTS_16[:4], params)[0]

    spec = engine_overrides(target, "eagle3", head=heads["eagle3"])
    assert run(5, *spec) == run(5, *engine_overrides(target))
    assert run(5, *spec) != run(6, *spec)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_coupled_drafts_are_accepted_far_more_often_than_greedy_ones(spec_pair, kind):
    """At T = 1 the head's argmax is often not the target's draw; a draft drawn with the target's noise
    for its own position is, at every depth (a draft step using another position's noise is not)."""
    target, heads = spec_pair
    params = [SamplingParams(max_new_tokens=40, temperature=1.0, seed=i, ignore_eos=True) for i in range(10)]
    measured = {}
    for mode in ("greedy", "sample"):
        _, metrics = token_ids(engine_overrides(target, kind, f"speculative.draft_sampling={mode}", head=heads[kind]),
                               PROMPTS_16[:10], params)
        measured[mode] = metrics["mean_accept_length"], metrics["accept_rate_per_position"]
    (tau_greedy, greedy), (tau_sample, sample) = measured["greedy"], measured["sample"]
    assert tau_sample > tau_greedy + 0.3
    assert sample[1] > 0.2 and sample[1] > 2 * greedy[1]
