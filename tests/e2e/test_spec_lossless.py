"""Speculative greedy output equals plain greedy output, token for token."""

import random

import pytest
import torch
from support import build_engine
from support.engines import PROMPTS, engine_overrides

from eyas import SamplingParams
from eyas.engine.sampling import SamplingBatch
from eyas.engine.speculative.candidate import Candidate

PARAMS = SamplingParams(max_new_tokens=28, ignore_eos=True)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("num_steps", [1, 2, 3, 5])
@pytest.mark.parametrize("page_size", [1, 16])
def test_greedy_speculative_equals_plain(spec_pair, plain_reference, kind, num_steps, page_size):
    target, heads = spec_pair
    overrides = engine_overrides(target, kind, f"cache.page_size={page_size}", head=heads[kind], num_steps=num_steps)
    with build_engine(overrides) as eng:
        outs = eng.generate(PROMPTS, PARAMS)
        metrics = eng.metrics()
        assert eng.scheduler.kv.all_free()
    assert [o.token_ids for o in outs] == plain_reference(target, PROMPTS, PARAMS)
    assert 1.0 <= metrics["mean_accept_length"] <= num_steps + 1
    assert len(metrics["accept_rate_per_position"]) == num_steps
    assert all(o.stats["num_verify_cycles"] > 0 for o in outs)
    # the trained heads agree often but not always: acceptance is ragged at every depth
    assert 0 < metrics["draft_accept_rate"] < 1
    assert all(rate > 0 for rate in metrics["accept_rate_per_position"])
    if num_steps >= 3:
        assert metrics["mean_accept_length"] >= 1.5


def test_zero_steps_is_plain_decoding_through_the_same_worker(spec_pair, plain_reference):
    target, heads = spec_pair
    with build_engine(engine_overrides(target, "eagle", head=heads["eagle"], num_steps=0)) as eng:
        outs = eng.generate(PROMPTS, PARAMS)
        assert type(eng.worker).__name__ == "SpeculativeWorker"
        assert eng.metrics()["mean_accept_length"] == 1.0
    assert [o.token_ids for o in outs] == plain_reference(target, PROMPTS, PARAMS)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("pair", ["fixture", "shipped"])
def test_a_tree_of_one_child_per_node_is_the_chain(spec_pair, kind, temperature, pair):
    """EAGLE-2 expansion with topk = 1 keeps every node: the tree is the chain the chain path drafts
    (the shipped pair's head reads its context, so a draft step that missed an ancestor shows), and
    verifying that chain on the fast path (causal, prefix match) accepts what the general tree path
    (tree mask, tree walk) accepts."""
    target, heads = spec_pair if pair == "fixture" else (None, {})  # None: the shipped target and heads
    with build_engine(engine_overrides(target, kind, head=heads.get(kind), num_steps=4)) as eng:
        requests = eng.submit(PROMPTS, SamplingParams(max_new_tokens=12, temperature=temperature, seed=3))
        for _ in range(3):
            eng.step()
        running = [r for r in eng.scheduler.running if not r.finished]
        assert running
        rows, lens = [r.row for r in running], [r.num_computed for r in running]
        sampling = SamplingBatch.of_requests(running, torch.device("cpu"))
        bonus = torch.tensor([r.output_ids[-1] for r in running])
        head, state = eng.worker.drafter.head, eng.worker.state
        chain = head.chain(rows, lens, sampling, bonus, 4, state.draft_decode_backend)
        tree = head.tree(rows, lens, sampling, bonus, Candidate(4, 1, 5), state.draft_decode_backend)
        fast = eng.worker.verifier.verify(running, chain, sampling, state)
        general = eng.worker.verifier.verify(running, tree, sampling, state)
        eng.abort(requests)
    assert torch.equal(tree.tokens, chain.tokens) and torch.equal(tree.tokens[:, 0], bonus)
    assert tree.parents.tolist() == [[-1, 0, 1, 2, 3]] * len(running) and not tree.is_chain
    assert fast.emitted == general.emitted and torch.equal(fast.keep, general.keep)
    assert fast.reach == general.reach == [4] * len(running)


def test_stop_inside_accepted_tokens_ends_the_request_there(spec_pair, plain_reference):
    target, heads = spec_pair
    free = plain_reference.outputs(target, PROMPTS, PARAMS)
    with build_engine(engine_overrides(target, "eagle", head=heads["eagle"], num_steps=5)) as eng:
        for i, out in enumerate(free):
            for cut in (3, 7, 11):
                victim = out.token_ids[cut]
                eng.stop_checker.eos_token_ids = frozenset({victim})
                got = eng.generate([PROMPTS[i]], SamplingParams(max_new_tokens=28))[0]
                assert got.token_ids == out.token_ids[:out.token_ids.index(victim) + 1]
                stop = out.text[cut:cut + 2]
                if stop.strip():
                    eng.stop_checker.eos_token_ids = frozenset()
                    got = eng.generate([PROMPTS[i]], SamplingParams(max_new_tokens=28, stop=[stop]))[0]
                    assert got.text == out.text[:out.text.find(stop)]
        for n in (1, 2, 5, 9):
            got = eng.generate(PROMPTS, SamplingParams(max_new_tokens=n, ignore_eos=True))
            assert [o.token_ids for o in got] == [o.token_ids[:n] for o in free]
        assert eng.scheduler.kv.all_free()


def test_no_kv_leak_after_500_random_requests(spec_pair):
    target, heads = spec_pair
    rng = random.Random(1)
    prompts = [[0] + [rng.randrange(2, 320) for _ in range(rng.randrange(1, 30))] for _ in range(500)]
    params = [SamplingParams(max_new_tokens=rng.randrange(1, 24), temperature=rng.choice([0.0, 0.8]), seed=i,
                             stop=rng.choice([[], ["e"]]), ignore_eos=rng.random() < 0.7) for i in range(500)]
    with build_engine(engine_overrides(target, "eagle", "cache.page_size=16", "cache.max_total_tokens=1024",
                                       "cache.max_running_requests=24", head=heads["eagle"])) as eng:
        outs = eng.generate(prompt_token_ids=prompts, sampling=params)
        assert all(o.finish_reason in ("stop", "length") for o in outs)
        assert all(1 <= len(o.token_ids) <= p.max_new_tokens for o, p in zip(outs, params))
        kv = eng.scheduler.kv
        assert kv.all_free()
        kv.clear_cache()  # the prefix cache gives back every page it kept
        assert kv.allocator.num_free_pages == kv.allocator.num_pages and kv.cached_pages == 0
        assert (kv.table.table == -1).all()
        assert eng.metrics()["mean_accept_length"] > 1.2


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_prefill_fills_the_draft_kv_of_exactly_the_prompt_positions(spec_pair, kind):
    """The draft head pairs prompt token p + 1 (the first output after the last) with the target feature
    of position p, at position p: its KV covers positions 0 .. len(prompt) - 1, nothing after."""
    from eyas.engine.request import Request

    target, heads = spec_pair
    with build_engine(engine_overrides(target, kind, "cache.page_size=1", head=heads[kind])) as eng:
        request = Request(0, [0, 5, 9, 14, 3, 8], SamplingParams(max_new_tokens=4))
        eng.scheduler.add(request)
        (req,) = eng.scheduler.schedule()
        eng.worker.prefill([req])
        slots = eng.worker.req_to_token[req.row, :len(request.prompt_ids) + 2]
        written = eng.worker.drafter.head.runner.kv_pool.k[0][slots].abs().sum(dim=(1, 2)) > 0
    assert written.tolist() == [True] * len(request.prompt_ids) + [False, False]
