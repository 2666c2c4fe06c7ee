"""The n-gram drafter (prompt lookup): its index against a brute-force reference, lossless against
plain decoding at batch 16 (chains and trees, greedy and seeded sampling, both attention backends,
adaptive), the command line with no other override, and its config errors."""

import random

import pytest
from support import assert_cli_run_equals_plain, build_engine
from support.engines import PARAMS_16, REPEATING_PROMPTS, engine_overrides, random_requests_match_plain

from eyas import ConfigError, SamplingParams
from eyas.engine.speculative.drafters.ngram_index import NgramIndex


def reference_proposals(tokens, min_match, max_match, max_tokens, max_branches):
    """Brute force: for the longest suffix first, the continuations of its earlier occurrences, newest first."""
    branches = []
    for n in range(min(max_match, len(tokens) - 1), min_match - 1, -1):
        suffix = tokens[len(tokens) - n:]
        for end in range(len(tokens) - 2, n - 2, -1):
            if tokens[end - n + 1:end + 1] == suffix:
                branch = tokens[end + 1:end + 1 + max_tokens]
                if branch not in branches:
                    branches.append(branch)
        if len(branches) >= max_branches:
            break
    return branches[:max_branches]


@pytest.mark.parametrize("seed", range(6))
def test_index_grown_token_by_token_proposes_what_a_rescan_finds(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(6) for _ in range(120)]  # a small vocabulary: many repeats
    low, high, branches = rng.choice([(1, 3), (2, 4), (1, 1)]), None, rng.choice([1, 3])
    low, high = low
    index = NgramIndex(tokens[:5], low, high, branches)
    for i in range(5, len(tokens)):
        index.extend(tokens[i:i + 1])
        assert index.propose(4) == reference_proposals(tokens[:i + 1], low, high, 4, branches), i


def test_index_prefers_the_longest_match_then_the_newest():
    index = NgramIndex([1, 2, 3, 9, 5, 2, 3, 7, 2, 3], 1, 3, max_branches=3)
    # suffix [2, 3] occurred twice before: newest first (followed by 7), then the older (followed by 9)
    assert index.propose(2) == [[7, 2], [9, 5]]
    assert NgramIndex([4, 5, 6], 1, 3).propose(3) == []  # nothing repeats
    assert NgramIndex([1, 2, 1, 2], 2, 2).propose(5) == [[1, 2]]  # a continuation stops at the end


@pytest.mark.parametrize("steps,topk,nodes", [(4, 1, None), (6, 1, None), (4, 2, 9), (5, 4, 12)])
def test_ngram_is_lossless_at_batch_16(spec_pair, plain_reference, steps, topk, nodes):
    target = spec_pair[0]
    with build_engine(engine_overrides(target, "ngram", num_steps=steps, topk=topk, nodes=nodes)) as eng:
        outs = eng.generate(REPEATING_PROMPTS, PARAMS_16)
        assert eng.metrics()["mean_accept_length"] > 1.0  # the lookup found continuations the target took
        assert eng.scheduler.kv.all_free()
        assert eng.worker.drafter.head is None  # no draft model
    assert [o.token_ids for o in outs] == plain_reference(target, REPEATING_PROMPTS, PARAMS_16)


@pytest.mark.slow
def test_ngram_on_the_triton_backend_and_one_token_pages(spec_pair, plain_reference):
    params = [SamplingParams(max_new_tokens=10, ignore_eos=True)] * 3
    expected = plain_reference(spec_pair[0], REPEATING_PROMPTS[:3], params)
    for extra, topk in (("attention=triton", 1), ("attention=triton", 2), ("cache.page_size=1", 3)):
        with build_engine(engine_overrides(spec_pair[0], "ngram", extra, topk=topk)) as eng:
            assert [o.token_ids for o in eng.generate(REPEATING_PROMPTS[:3], params)] == expected, (extra, topk)


def test_ngram_under_adaptive_control_is_lossless(spec_pair, plain_reference):
    target = spec_pair[0]
    with build_engine(engine_overrides(target, "ngram", "adaptive=throughput", num_steps=None)) as eng:
        outs = eng.generate(REPEATING_PROMPTS, PARAMS_16)
        assert sum(eng.metrics()["adaptive_cycles_at_steps"].values()) > 0
    assert [o.token_ids for o in outs] == plain_reference(target, REPEATING_PROMPTS, PARAMS_16)


def test_no_kv_leak_after_random_requests_with_ngram(spec_pair):
    overrides = engine_overrides(spec_pair[0], "ngram", "cache.page_size=16", "cache.max_total_tokens=1024",
                                 "cache.max_running_requests=24", num_steps=5, topk=2, nodes=9)
    random_requests_match_plain(spec_pair[0], overrides, 150, seed=5, vocab=40)  # few ids: many repeats


@pytest.mark.slow  # a process; the README's `python -m eyas speculative=ngram` runs by default
def test_ngram_from_the_command_line_with_no_other_override(tmp_path):
    assert_cli_run_equals_plain("ngram", tmp_path)


@pytest.mark.parametrize("override,field", [
    ("speculative.ngram_min_match=0", "speculative.ngram_min_match"),
    ("speculative.ngram_max_match=0", "speculative.ngram_max_match"),
    ("draft=eagle3", "draft.kind"),
])
def test_ngram_config_errors_name_the_field(spec_pair, override, field):
    with pytest.raises(ConfigError, match=field):
        build_engine([f"model.path={spec_pair[0]}", "speculative=ngram", override])


# --- hybrid: the EAGLE head and n-gram lookup in one drafter ---

@pytest.mark.parametrize("kind,steps,topk,nodes,trust", [
    ("eagle3", 3, 1, None, 2), ("eagle", 4, 1, None, 1), ("eagle3", 3, 2, None, 2), ("eagle", 4, 4, 14, 3)])
def test_hybrid_is_lossless_at_batch_16(spec_pair, plain_reference, kind, steps, topk, nodes, trust):
    target, heads = spec_pair
    with build_engine(engine_overrides(target, "hybrid", f"speculative.ngram_trust={trust}", head=heads[kind],
                                       draft=kind, num_steps=steps, topk=topk, nodes=nodes)) as eng:
        outs = eng.generate(REPEATING_PROMPTS, PARAMS_16)
        assert eng.metrics()["mean_accept_length"] > 1.3
        assert eng.scheduler.kv.all_free()
    assert [o.token_ids for o in outs] == plain_reference(target, REPEATING_PROMPTS, PARAMS_16)


def test_hybrid_runs_the_head_only_where_the_lookup_is_not_trusted(spec_pair, plain_reference):
    """Trust 1: cycles where every request's suffix occurred before draft by lookup alone; the head
    drafts the others, after catching up its held draft-extend, and output stays plain decoding's."""
    target, heads = spec_pair
    overrides = engine_overrides(target, "hybrid", "speculative.ngram_trust=1", head=heads["eagle3"])
    with build_engine(overrides) as eng:
        proposals, drafts, sat_out = [], [], []
        drafter = eng.worker.drafter
        deferred = drafter.eagle.deferred
        propose, draft, hold = drafter.propose, drafter.head.chain, deferred.hold
        drafter.propose = lambda *a, **kw: proposals.append(1) or propose(*a, **kw)
        drafter.head.chain = lambda *a, **kw: drafts.append(1) or draft(*a, **kw)
        deferred.hold = lambda *a, **kw: sat_out.append(kw.get("sat_out", True)) or hold(*a, **kw)
        outs = eng.generate(REPEATING_PROMPTS, PARAMS_16)
        alone = eng.generate(REPEATING_PROMPTS[:1], PARAMS_16[:1])  # text that repeats, alone: its matches decide
    plain = plain_reference(target, REPEATING_PROMPTS, PARAMS_16)
    assert [o.token_ids for o in outs] == plain and alone[0].token_ids == plain[0]
    assert 0 < len(drafts) < len(proposals)
    # the rule's own skips are part of its running cost: not held as sitting out (see `prepare`)
    assert sat_out and not any(sat_out)


@pytest.mark.slow  # the Triton interpreter
def test_hybrid_on_triton_and_under_adaptive_control(spec_pair, plain_reference):
    target, heads = spec_pair
    params = [SamplingParams(max_new_tokens=10, ignore_eos=True)] * 3
    expected = plain_reference(target, REPEATING_PROMPTS[:3], params)
    with build_engine(engine_overrides(target, "hybrid", "attention=triton", head=heads["eagle"], draft="eagle",
                                       topk=2)) as eng:
        assert [o.token_ids for o in eng.generate(REPEATING_PROMPTS[:3], params)] == expected
    overrides = engine_overrides(target, "hybrid", "adaptive=throughput", head=heads["eagle3"], num_steps=None)
    with build_engine(overrides) as eng:
        outs = eng.generate(REPEATING_PROMPTS, PARAMS_16)
    assert [o.token_ids for o in outs] == plain_reference(target, REPEATING_PROMPTS, PARAMS_16)


@pytest.mark.slow
def test_hybrid_from_the_command_line_with_no_other_override(tmp_path):
    assert_cli_run_equals_plain("hybrid", tmp_path)


@pytest.mark.parametrize("override,field", [
    ("speculative.ngram_trust=0", "speculative.ngram_trust"),
    ("draft=ngram", "draft.kind"),
    ("speculative.topk=2 speculative.num_draft_tokens=40", "speculative.num_draft_tokens"),
])
def test_hybrid_config_errors_name_the_field(spec_pair, override, field):
    with pytest.raises(ConfigError, match=field):
        build_engine([f"model.path={spec_pair[0]}", "speculative=hybrid", *override.split()])
