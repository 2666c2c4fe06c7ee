"""The standalone drafter (a small LM with the target's tokenizer): lossless against plain decoding at
batch 16 (chains and trees, greedy and seeded sampling, both draft sampling modes, both attention
backends, adaptive), its KV rolled back exactly (the target as its own drafter accepts every greedy
draft), the command line with no other override, and a draft LM that does not fit."""


import pytest

from conftest import PLAIN, random_requests_match_plain
from engine import SamplingParams, build_engine
from engine.assets import asset_path
from engine.errors import CheckpointError
from test_spec_ngram import assert_cli_run_equals_plain
from test_spec_trees import PARAMS, PROMPTS


def standalone_overrides(target, draft, num_steps=3, topk=1, nodes=None, *extra):
    nodes = nodes if nodes is not None else num_steps * topk + 1
    return [f"model.path={target}", "speculative=standalone", f"draft.path={draft}", "adaptive=off",
            f"speculative.num_steps={num_steps}", f"speculative.topk={topk}",
            f"speculative.num_draft_tokens={nodes}", *extra]


@pytest.fixture(scope="module")
def plain(spec_pair):
    with build_engine([*PLAIN, f"model.path={spec_pair[0]}"]) as eng:
        return [o.token_ids for o in eng.generate(PROMPTS, PARAMS)]


@pytest.mark.parametrize("steps,topk,nodes,draft_sampling", [
    (3, 1, None, "sample"), (5, 1, None, "greedy"), (3, 2, 6, "sample"), (4, 4, 12, "greedy")])
def test_standalone_is_lossless_at_batch_16(spec_pair, plain, steps, topk, nodes, draft_sampling):
    target = spec_pair[0]  # its own drafter: greedy drafts always right, greedy-drafted samples often wrong
    overrides = standalone_overrides(target, target, steps, topk, nodes, f"speculative.draft_sampling={draft_sampling}")
    with build_engine(overrides) as eng:
        outs = eng.generate(PROMPTS, PARAMS)
        assert eng.worker.drafter.head.model.kind == "lm"
        assert eng.scheduler.kv.all_free()
    assert [o.token_ids for o in outs] == plain


@pytest.mark.parametrize("steps", [1, 3, 6])
def test_the_target_as_its_own_drafter_accepts_every_greedy_draft(spec_pair, steps):
    """Every cycle accepts all k drafts, so every catch-up feeds the last draft and the new bonus:
    a draft KV position left stale or rolled back wrongly would show as a rejected draft."""
    target = spec_pair[0]
    params = [SamplingParams(max_new_tokens=30, ignore_eos=True)] * 4
    with build_engine(standalone_overrides(target, target, steps)) as eng:
        eng.generate(PROMPTS[:4], params)
        assert eng.metrics()["draft_accept_rate"] == 1.0
        assert eng.metrics()["mean_accept_length"] == steps + 1


def test_standalone_on_the_triton_backend_and_one_token_pages(spec_pair):
    target = spec_pair[0]
    params = [SamplingParams(max_new_tokens=10, ignore_eos=True, temperature=t, seed=i) for i, t in enumerate([0, 0.9, 0])]
    with build_engine([*PLAIN, f"model.path={target}"]) as eng:
        expected = [o.token_ids for o in eng.generate(PROMPTS[:3], params)]
    for extra, topk, nodes in (("attention=triton", 1, None), ("attention=triton", 2, 5), ("cache.page_size=1", 2, 6)):
        overrides = standalone_overrides(target, target, 3, topk, nodes, extra, "speculative.draft_sampling=greedy")
        with build_engine(overrides) as eng:
            assert [o.token_ids for o in eng.generate(PROMPTS[:3], params)] == expected, (extra, topk)


def test_standalone_under_adaptive_control_is_lossless(spec_pair, plain):
    target = spec_pair[0]
    overrides = [f"model.path={target}", "speculative=standalone", f"draft.path={target}", "adaptive=throughput",
                 "speculative.draft_sampling=greedy"]
    with build_engine(overrides) as eng:
        outs = eng.generate(PROMPTS, PARAMS)
        assert len(eng.metrics()["adaptive_cycles_at_steps"]) > 1  # it ran more than one step count
    assert [o.token_ids for o in outs] == plain


def test_no_kv_leak_after_random_requests_with_standalone(spec_pair):
    target = spec_pair[0]
    overrides = standalone_overrides(target, target, 3, 2, 6, "cache.page_size=16", "cache.max_total_tokens=1024",
                                     "cache.max_running_requests=24", "speculative.draft_sampling=greedy")
    random_requests_match_plain(target, overrides, 120, seed=7)


def test_standalone_from_the_command_line_with_no_other_override(tmp_path):
    assert_cli_run_equals_plain("standalone", tmp_path)


def test_a_draft_lm_with_another_vocabulary_is_refused(spec_pair):
    with pytest.raises(CheckpointError, match="vocab_size"):
        build_engine(standalone_overrides(spec_pair[0], asset_path("draft_lm")))
