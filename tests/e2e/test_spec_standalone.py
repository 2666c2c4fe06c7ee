"""The standalone drafter (a small LM with the target's tokenizer): lossless against plain decoding at
batch 16 (chains and trees, greedy and seeded sampling, both draft sampling modes, both attention
backends, adaptive), its KV rolled back exactly (the target as its own drafter accepts every greedy
draft), the command line with no other override, and a draft LM that does not fit."""


import pytest
from support import assert_cli_run_equals_plain, build_engine
from support.engines import PARAMS_16, PROMPTS, PROMPTS_16, engine_overrides, random_requests_match_plain

from eyas import SamplingParams
from eyas.engine.assets import asset_path
from eyas.engine.errors import CheckpointError


@pytest.mark.parametrize("steps,topk,nodes,draft_sampling", [
    (3, 1, None, "sample"), (5, 1, None, "greedy"), (3, 2, 6, "sample"), (4, 4, 12, "greedy")])
def test_standalone_is_lossless_at_batch_16(spec_pair, plain_reference, steps, topk, nodes, draft_sampling):
    target = spec_pair[0]  # its own drafter: greedy drafts always right, greedy-drafted samples often wrong
    overrides = engine_overrides(target, "standalone", f"speculative.draft_sampling={draft_sampling}", head=target,
                                 num_steps=steps, topk=topk, nodes=nodes)
    with build_engine(overrides) as eng:
        outs = eng.generate(PROMPTS_16, PARAMS_16)
        assert eng.worker.drafter.head.model.kind == "lm"
        assert eng.scheduler.kv.all_free()
    assert [o.token_ids for o in outs] == plain_reference(target, PROMPTS_16, PARAMS_16)


@pytest.mark.parametrize("steps", [1, 3, 6])
def test_the_target_as_its_own_drafter_accepts_every_greedy_draft(spec_pair, steps):
    """Every cycle accepts all k drafts, so every catch-up feeds the last draft and the new bonus:
    a draft KV position left stale or rolled back wrongly would show as a rejected draft."""
    target = spec_pair[0]
    params = [SamplingParams(max_new_tokens=30, ignore_eos=True)] * 4
    with build_engine(engine_overrides(target, "standalone", head=target, num_steps=steps)) as eng:
        eng.generate(PROMPTS[:4], params)
        assert eng.metrics()["draft_accept_rate"] == 1.0
        assert eng.metrics()["mean_accept_length"] == steps + 1


@pytest.mark.slow
def test_standalone_on_the_triton_backend_and_one_token_pages(spec_pair, plain_reference):
    target = spec_pair[0]
    params = [SamplingParams(max_new_tokens=10, ignore_eos=True, temperature=t, seed=i) for i, t in enumerate([0, 0.9, 0])]
    expected = plain_reference(target, PROMPTS[:3], params)
    for extra, topk, nodes in (("attention=triton", 1, None), ("attention=triton", 2, 5), ("cache.page_size=1", 2, 6)):
        overrides = engine_overrides(target, "standalone", extra, "speculative.draft_sampling=greedy", head=target,
                                     topk=topk, nodes=nodes)
        with build_engine(overrides) as eng:
            assert [o.token_ids for o in eng.generate(PROMPTS[:3], params)] == expected, (extra, topk)


def test_standalone_under_adaptive_control_is_lossless(spec_pair, plain_reference):
    target = spec_pair[0]
    overrides = engine_overrides(target, "standalone", "adaptive=throughput", "speculative.draft_sampling=greedy",
                                 head=target, num_steps=None)
    with build_engine(overrides) as eng:
        outs = eng.generate(PROMPTS_16, PARAMS_16)
        assert len(eng.metrics()["adaptive_cycles_at_steps"]) > 1  # it ran more than one step count
    assert [o.token_ids for o in outs] == plain_reference(target, PROMPTS_16, PARAMS_16)


def test_no_kv_leak_after_random_requests_with_standalone(spec_pair):
    target = spec_pair[0]
    overrides = engine_overrides(target, "standalone", "cache.page_size=16", "cache.max_total_tokens=1024",
                                 "cache.max_running_requests=24", "speculative.draft_sampling=greedy", head=target,
                                 topk=2, nodes=6)
    random_requests_match_plain(target, overrides, 120, seed=7)


@pytest.mark.slow
def test_standalone_from_the_command_line_with_no_other_override(tmp_path):
    assert_cli_run_equals_plain("standalone", tmp_path)


def test_a_draft_lm_with_another_vocabulary_is_refused(spec_pair):
    with pytest.raises(CheckpointError, match="vocab_size"):
        build_engine(engine_overrides(spec_pair[0], "standalone", head=asset_path("draft_lm")))


def test_the_lm_keeps_its_kv_only_where_it_fed_the_emitted_tokens():
    """After a verify the LM's KV is current through the accepted drafts it fed itself: where a structured
    request's chain was refilled with a token the grammar forces (accepted, but not the LM's draft), the
    LM must feed that position again."""
    from types import SimpleNamespace

    from eyas.engine.speculative.drafters.standalone import StandaloneDrafter

    drafter = StandaloneDrafter(head=None)
    requests = [SimpleNamespace(row=0), SimpleNamespace(row=1)]
    for row in (0, 1):
        drafter.computed[row] = 10 + 4  # the bonus at 10, drafts fed through 13
        drafter._drafted[row] = [5, 6, 7, 8]
    verified = SimpleNamespace(prefix_lens=[10, 10], emitted=[[5, 6, 3], [5, 9, 3]])  # row 1: 9 was the grammar's
    drafter.after_verify(requests, verified, None)
    assert drafter.computed == {0: 10 + 3, 1: 10 + 2}

