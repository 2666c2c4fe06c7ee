"""Rejection-sampling verification (`speculative.verify=rejection`, the default) at the engine level:
repeatable for a seed, greedy requests untouched, more drafts accepted than the reproducible rule, and
adaptive policies that learn sampled and greedy batches apart. (Its distribution: test_spec_sampling.)"""

import pytest
from support import build_engine
from support.engines import PROMPTS_16, engine_overrides

from eyas import SamplingParams

PARAMS = [SamplingParams(max_new_tokens=24, temperature=t, top_p=p, seed=50 + i, ignore_eos=True)
          for i, (t, p) in enumerate([(0.8, 0.95), (0.0, 1.0), (1.0, 1.0), (0.6, 0.9)] * 2)]
BATCH = "cache.max_running_requests=8"


def generate(overrides, params=PARAMS, prompts=PROMPTS_16[:8]):
    with build_engine([*overrides, BATCH]) as eng:
        outs = eng.generate(prompts, params)
        assert eng.scheduler.kv.all_free()
        return [o.token_ids for o in outs], eng.metrics()


@pytest.mark.parametrize("kind,num_steps,topk", [("eagle3", 3, 1), ("eagle", 3, 2), ("ngram", 4, 1)])
def test_rejection_repeats_for_a_seed_and_leaves_greedy_requests_as_plain(spec_pair, plain_reference, kind,
                                                                          num_steps, topk):
    target, heads = spec_pair
    overrides = engine_overrides(target, kind, "speculative.verify=rejection", head=heads.get(kind),
                                 num_steps=num_steps, topk=topk)
    first, metrics = generate(overrides)
    again, _ = generate(overrides)
    assert first == again  # the noise is keyed by (seed, position): a run repeats
    plain = plain_reference(target, PROMPTS_16[:8], PARAMS, BATCH)
    greedy = [i for i, p in enumerate(PARAMS) if p.greedy]
    assert [first[i] for i in greedy] == [plain[i] for i in greedy]
    assert 0 < metrics["draft_accept_rate"] < 1
    assert len({tuple(t) for t in first}) == len(first)  # really sampled


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_rejection_accepts_more_sampled_drafts_than_the_reproducible_rule(spec_pair, kind):
    """min(1, p/q) accepts a draft with probability 1 - TV(p, q); a coupled draft matches the target's
    keyed sample less often (at least (1 - TV) / (1 + TV))."""
    target, heads = spec_pair
    params = [SamplingParams(max_new_tokens=40, temperature=1.0, seed=i, ignore_eos=True) for i in range(16)]
    tau = {}
    for mode in ("reproducible", "rejection"):
        _, metrics = generate(engine_overrides(target, kind, f"speculative.verify={mode}", head=heads[kind]),
                              params, PROMPTS_16)
        tau[mode] = metrics["mean_accept_length"]
    assert tau["rejection"] > tau["reproducible"], tau


def test_adaptive_learns_sampled_and_greedy_batches_apart(spec_pair):
    target, heads = spec_pair
    overrides = engine_overrides(target, "eagle3", "adaptive=throughput", head=heads["eagle3"], num_steps=None)
    with build_engine([*overrides, BATCH]) as eng:
        controller = eng.worker.controller
        sampled, greedy = controller.policies[True][0], controller.policies[False][0]
        eng.generate(PROMPTS_16[:1], SamplingParams(max_new_tokens=20, temperature=0.8, seed=1, ignore_eos=True))
        assert sampled.cycles > 0 and greedy.cycles == 0
        eng.generate(PROMPTS_16[:1], SamplingParams(max_new_tokens=20, ignore_eos=True))
        assert greedy.cycles > 0
        # each kind has its own acceptance figures
        assert sampled.acceptance is not greedy.acceptance
