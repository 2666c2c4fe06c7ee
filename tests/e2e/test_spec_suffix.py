"""Suffix decoding: the index against brute force (matches across streams, continuation counts, the
depth rule, eviction), lossless against plain decoding (chains, trees, the hybrid over it, adaptive
candidates, both backends), a request that repeats an earlier one drafting from it, the command
line, and the config errors."""

import random
from collections import Counter

import pytest
from support import assert_cli_run_equals_plain, build_engine
from support.engines import PARAMS_16, REPEATING_PROMPTS, engine_overrides, random_requests_match_plain

from eyas import ConfigError, SamplingParams
from eyas.engine.speculative.drafters.suffix_index import SuffixIndex, _match_length


def reference_match(streams: dict[int, list[int]], sid: int, key_lengths: range, cap: int):
    """Brute force: the longest match (at most `cap`, at least the shortest key) of stream sid's suffix
    ending at an indexed position (one with a token after it) of any stream, and where each occurrence
    of it continues."""
    ctx = streams[sid]
    best, found = 0, []
    for s, stream in streams.items():
        for end in range(len(stream) - 1):  # an n-gram ending here has a continuation
            m = 0
            while m < min(cap, end + 1, len(ctx)) and stream[end - m] == ctx[len(ctx) - 1 - m]:
                m += 1
            if m < key_lengths.start:
                continue
            if m > best:
                best, found = m, [(s, end + 1)]
            elif m == best:
                found.append((s, end + 1))
    return best, sorted(found)


@pytest.mark.parametrize("seed", range(8))
def test_match_is_the_longest_earlier_occurrence_in_any_stream(seed):
    rng = random.Random(seed)
    keys, cap = rng.choice([range(1, 5), range(2, 4), range(1, 2)]), rng.choice([4, 8, 32])
    index = SuffixIndex(keys, cap, max_tokens=1 << 20, max_occurrences=1 << 20)
    streams, ids = {}, []
    for _ in range(4):
        tokens = [rng.randrange(5) for _ in range(rng.randrange(1, 30))]
        ids.append(index.open(tokens))
        streams[ids[-1]] = list(tokens)
    for step in range(60):
        sid = rng.choice(ids)
        token = rng.randrange(5)
        index.extend(sid, [token])
        streams[sid].append(token)
        length, found = index.match(sid)
        expected_length, expected = reference_match(streams, sid, keys, cap)
        positions = sorted((next(s for s, t in index.streams.items() if t is stream), start) for stream, start in found)
        # the index finds occurrences through its longest key first: a match longer than every key is
        # measured on, and one no key reaches is none
        assert length == expected_length, step
        assert positions == expected, step


def test_match_length_by_halving_equals_a_scan():
    rng = random.Random(3)
    for _ in range(500):
        stream = [rng.randrange(3) for _ in range(rng.randrange(1, 40))]
        ctx = [rng.randrange(3) for _ in range(rng.randrange(1, 40))]
        end, cap = rng.randrange(len(stream)), rng.randrange(1, 50)
        scan = 0
        while scan < min(cap, end + 1, len(ctx)) and stream[end - scan] == ctx[-1 - scan]:
            scan += 1
        if scan:
            assert _match_length(stream, end, ctx, 1, cap) == scan


def test_continuations_are_counted_and_kept_by_share_depth_and_budget():
    index = SuffixIndex(range(1, 3), 32, 1 << 20, 64)
    # after [7, 8] came 1 2 3 three times and 1 5 once; the live stream ends in [7, 8]
    for tail in ([1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 5, 6]):
        index.finish(index.open([9, 7, 8, *tail, 0]))
    live = index.open([4, 7, 8])
    assert index.match(live)[0] == 2
    # factor 1 x match 2: two tokens deep at most
    assert index.continuations(live, 16, 1, 16, 0.0, 1.0) == (2, [[1], [1, 2]])
    assert index.continuations(live, 16, 1, 16, 0.0, 2.0)[1] == [[1], [1, 2], [1, 2, 3], [1, 2, 3, 0]]  # factor 2
    # a tree: both branches, most shared first; a 1/4 branch cut at min share 0.3, kept at 0.2
    assert index.continuations(live, 3, 2, 8, 0.2, 2.0)[1] == [[1], [1, 2], [1, 2, 3], [1, 5], [1, 5, 6]]
    assert index.continuations(live, 3, 2, 8, 0.3, 2.0)[1] == [[1], [1, 2], [1, 2, 3]]
    assert index.continuations(live, 3, 2, 2, 0.0, 2.0)[1] == [[1], [1, 2]]  # the node budget
    assert index.continuations(index.open([11, 12]), 8, 1, 8, 0.0, 1.0) == (0, [])  # nothing matches


def test_memory_is_bounded_by_dropping_the_oldest_finished_streams():
    index = SuffixIndex(range(1, 4), 32, max_tokens=100, max_occurrences=64)
    live = index.open(list(range(60)))  # a live stream is never dropped, however long
    finished = []
    for i in range(10):
        finished.append(index.open([1000 + i] * 30))
        index.finish(finished[-1])
        assert index.num_tokens <= 100 or list(index.streams) == [live, finished[-1]]
    assert live in index.streams and finished[-1] in index.streams and finished[0] not in index.streams
    assert index.num_tokens == sum(map(len, index.streams.values()))
    # entries of dropped streams are counted dead, never returned by a lookup, and swept out
    assert index._dead > 0 and any((e >> 32) not in index.streams for es in index._ends.values() for e in es)
    probe = index.open([1000, 1000])  # the dropped streams held 1000s: only live ones may answer
    assert all(stream is index.streams[finished[-1]] or stream is index.streams[probe]
               for stream, _ in index.match(probe)[1])
    index._sweep()
    assert all((e >> 32) in index.streams for entries in index._ends.values() for e in entries)
    assert sum(map(len, index._ends.values())) == index._entries


@pytest.mark.parametrize("steps,topk,nodes", [(6, 1, None), (12, 1, None), (6, 2, 10), (5, 4, 12)])
def test_suffix_is_lossless_at_batch_16(spec_pair, plain_reference, steps, topk, nodes):
    target = spec_pair[0]
    with build_engine(engine_overrides(target, "suffix", num_steps=steps, topk=topk, nodes=nodes)) as eng:
        outs = eng.generate(REPEATING_PROMPTS, PARAMS_16)
        assert eng.metrics()["mean_accept_length"] > 1.0
        assert eng.scheduler.kv.all_free()
        assert eng.worker.drafter.head is None  # no draft model
    assert [o.token_ids for o in outs] == plain_reference(target, REPEATING_PROMPTS, PARAMS_16)


def test_a_request_drafts_what_an_earlier_request_wrote(spec_pair, plain_reference):
    """The second time a prompt comes, its output is drafted from the first's: its verify cycles accept
    far more than the first request's, and more than n-gram lookup, which sees only the request's own
    tokens, gets on the same requests."""
    target = spec_pair[0]
    params = SamplingParams(max_new_tokens=40, ignore_eos=True, temperature=0.0)
    prompts = ["x = [1, 2, 3]\ny =", "x = [1, 2, 3]\ny ="]
    taus = {}
    for algorithm in ("suffix", "ngram"):
        with build_engine(engine_overrides(target, algorithm, num_steps=12, topk=1)) as eng:
            outs = [eng.generate([p], params)[0] for p in prompts]
            taus[algorithm] = [o.stats["mean_accept_length"] for o in outs]
            assert [o.token_ids for o in outs] == [plain_reference(target, [p], [params])[0] for p in prompts]
    assert taus["suffix"][1] > 2 * taus["suffix"][0] and taus["suffix"][1] > 2 * taus["ngram"][1], taus


def test_ended_and_preempted_requests_hand_their_streams_over_and_memory_stays_bounded(spec_pair, plain_reference):
    """Every request that ends or is preempted marks its stream finished (none stays live after
    `generate`), and finished streams past `suffix_max_tokens` are dropped, oldest first."""
    target = spec_pair[0]
    params = [SamplingParams(max_new_tokens=30, ignore_eos=True, temperature=0.0)] * 16
    overrides = engine_overrides(target, "suffix", "speculative.suffix_max_tokens=1024", "cache.page_size=4",
                                 "cache.max_total_tokens=160", "cache.max_running_requests=6", num_steps=6)
    with build_engine(overrides) as eng:
        index = eng.worker.drafter.index
        outs = [o for _ in range(4) for o in eng.generate(REPEATING_PROMPTS, params)]
        assert eng.metrics()["preemptions"] > 0  # a small pool: some requests were preempted and came back
        assert eng.worker.drafter.streams == {} and set(index.finished) == set(index.streams)
        assert 0 < index.num_tokens <= 1024 and index._next_id > len(index.streams)  # some were dropped
    assert [o.token_ids for o in outs] == plain_reference(target, REPEATING_PROMPTS, params) * 4


@pytest.mark.slow
def test_suffix_on_triton_one_token_pages_and_random_requests(spec_pair, plain_reference):
    params = [SamplingParams(max_new_tokens=10, ignore_eos=True)] * 3
    expected = plain_reference(spec_pair[0], REPEATING_PROMPTS[:3], params)
    for extra, topk in (("attention=triton", 1), ("attention=triton", 2), ("cache.page_size=1", 3)):
        with build_engine(engine_overrides(spec_pair[0], "suffix", extra, topk=topk)) as eng:
            assert [o.token_ids for o in eng.generate(REPEATING_PROMPTS[:3], params)] == expected, (extra, topk)
    overrides = engine_overrides(spec_pair[0], "suffix", "cache.page_size=16", "cache.max_total_tokens=1024",
                                 "cache.max_running_requests=24", "speculative.suffix_max_tokens=1024",
                                 num_steps=8, topk=2, nodes=9)
    random_requests_match_plain(spec_pair[0], overrides, 150, seed=6, vocab=40)  # eviction under way


def test_hybrid_over_suffix_lookup_and_suffix_as_an_adaptive_candidate(spec_pair, plain_reference):
    target, heads = spec_pair
    expected = plain_reference(target, REPEATING_PROMPTS, PARAMS_16)
    with build_engine(engine_overrides(target, "hybrid", "speculative.hybrid_lookup=suffix", head=heads["eagle3"],
                                       num_steps=4)) as eng:
        assert eng.worker.drafter.lookup is eng.worker.drafter.lookups["suffix"]
        assert [o.token_ids for o in eng.generate(REPEATING_PROMPTS, PARAMS_16)] == expected
    tiers = "adaptive.tiers=[{batch_size:4,candidates:[1,2,{drafter:suffix,num_steps:8}]},{batch_size:16,candidates:[0,1,{drafter:suffix,num_steps:4,topk:2,num_draft_tokens:6}]}]"
    with build_engine(engine_overrides(target, "eagle3", "adaptive=throughput", tiers, head=heads["eagle3"],
                                       num_steps=None)) as eng:
        outs = eng.generate(REPEATING_PROMPTS, PARAMS_16)
        outs += eng.generate(REPEATING_PROMPTS[:3], PARAMS_16[:3])
        chosen = Counter(eng.metrics()["adaptive_cycles_at_steps"])
    assert [o.token_ids for o in outs] == expected + expected[:3]
    assert chosen["suffix:8"] > 0 and chosen["suffix:4x2/6"] > 0, chosen


def test_the_default_config_lists_suffix_decoding_and_stays_lossless(spec_pair, plain_reference):
    target, heads = spec_pair
    # seeded sampled requests equal plain decoding's under `reproducible` verification (rejection: by distribution)
    with build_engine([f"model.path={target}", f"draft.path={heads['eagle3']}", "speculative.verify=reproducible"]) as eng:
        labels = {str(c) for c in eng.worker.controller.all_candidates}
        outs = eng.generate(REPEATING_PROMPTS, PARAMS_16)
    assert {"suffix:16", "suffix:8"} <= labels
    assert [o.token_ids for o in outs] == plain_reference(target, REPEATING_PROMPTS, PARAMS_16)


@pytest.mark.slow
def test_suffix_from_the_command_line_with_no_other_override(tmp_path):
    assert_cli_run_equals_plain("suffix", tmp_path)


@pytest.mark.parametrize("override,field", [
    ("speculative.suffix_max_tokens=100", "speculative.suffix_max_tokens must be an integer in 1024..16777216"),
    ("speculative.suffix_max_tokens=1e12", "speculative.suffix_max_tokens"),
    ("speculative.suffix_max_match=2", r"speculative.suffix_max_match must be an integer in speculative.ngram_max_match \(4\)..4096"),
    ("speculative.suffix_max_spec_factor=0", r"speculative.suffix_max_spec_factor must be a number in \(0, 64.0\]"),
    ("speculative.suffix_max_spec_factor=inf", "speculative.suffix_max_spec_factor"),
    ("speculative.suffix_max_spec_factor=nan", "speculative.suffix_max_spec_factor"),
    ("speculative.ngram_max_match=2000", r"speculative.ngram_max_match must be an integer in speculative.ngram_min_match \(1\)..32"),
    ("speculative.suffix_max_match=5000", "speculative.suffix_max_match must be an integer in"),
    ("speculative.hybrid_lookup=trie", "hybrid_lookup"),
    ("speculative.suffix_min_token_prob=1.5", r"speculative.suffix_min_token_prob must be in \[0, 1\]"),
    ("speculative.ngram_min_match=0", "speculative.ngram_min_match"),
    ("draft=eagle3", "draft.kind"),
])
def test_suffix_config_errors_name_the_field(spec_pair, override, field):
    with pytest.raises(ConfigError, match=field):
        build_engine([f"model.path={spec_pair[0]}", "speculative=suffix", override])
