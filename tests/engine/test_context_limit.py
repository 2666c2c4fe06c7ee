"""One context limit, whatever the speculation: `cache.max_context_len` decides which prompts are
admitted, where generation stops and what the error says; the lookahead a speculative step writes past
the committed length widens the request table only."""

import random
from types import SimpleNamespace

import pytest
import torch
from support import build_engine
from support.engines import engine_overrides

from eyas import SamplingParams
from eyas.containers.cache import CacheContainer
from eyas.engine.cache.allocator import PageAllocator
from eyas.engine.cache.manager import KVCacheManager
from eyas.engine.cache.req_to_token import ReqToTokenTable
from eyas.engine.config.schema import CacheConfig
from eyas.engine.request import Request
from eyas.engine.scheduler import Scheduler
from eyas.engine.stopping import StopChecker

LIMIT = 64
AROUND_LIMIT = (62, 63, 64, 65)
CACHE = [f"cache.max_context_len={LIMIT}", "cache.page_size=16"]
PARAMS = SamplingParams(max_new_tokens=100, ignore_eos=True)


def scheduler_for(lookahead: int, page_size: int = 1) -> Scheduler:
    table = ReqToTokenTable(max_requests=2, max_context_len=LIMIT, lookahead_tokens=lookahead, device=torch.device("cpu"))
    kv = KVCacheManager(PageAllocator(4 * (LIMIT + lookahead) // page_size), table, page_size)
    return Scheduler(kv, max_running_requests=2, max_prefill_tokens=8192, lookahead_tokens=lookahead)


def request_of(length: int, max_new_tokens: int = 100) -> Request:
    return Request(length, [0] + [2] * (length - 1), SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True))


def test_lookahead_widens_the_table_and_leaves_admission_alone():
    plain, spec = scheduler_for(0), scheduler_for(5)
    for scheduler, lookahead in ((plain, 0), (spec, 5)):
        kv = scheduler.kv
        assert kv.max_context_len == kv.table.max_context_len == LIMIT
        assert kv.table.width == LIMIT + lookahead and kv.table.table.shape == (2, LIMIT + lookahead)
        assert kv.pages_for(10 * LIMIT) == LIMIT + lookahead  # page_size 1: never past the table
    errors = [[s.admission_error(request_of(n)) for n in AROUND_LIMIT] for s in (plain, spec)]
    assert errors[0] == errors[1]
    assert errors[0][:2] == [None, None]
    for n, error in zip(AROUND_LIMIT[2:], errors[0][2:]):
        assert error == (f"prompt of {n} tokens does not fit the context: it must be shorter than "
                         f"cache.max_context_len = {LIMIT}")


def test_kv_covers_the_context_and_the_lookahead_past_it():
    scheduler = scheduler_for(5)
    request = request_of(LIMIT - 1)
    assert scheduler.kv_tokens_for(request) == LIMIT + 5  # the longest sequence, then one step's lookahead
    scheduler.add(request)
    assert scheduler.schedule() == [request]
    table = scheduler.kv.table.table[request.row]
    assert (table[:LIMIT - 1 + 5] >= 0).all() and (table[LIMIT - 1 + 5:] == -1).all()
    # the stop checker ends the request at the same limit the scheduler admits against
    stop = StopChecker(None, (), scheduler.kv.max_context_len)
    assert stop.append(request, 7) and request.finish_reason == "length" and request.seq_len == LIMIT
    scheduler.release_finished()
    assert scheduler.kv.all_free() and (scheduler.kv.table.table == -1).all()


@pytest.mark.parametrize("page_size", [1, 16])
def test_growth_fills_the_lookahead_columns_up_to_the_table_width(page_size):
    scheduler = scheduler_for(5, page_size)
    kv = scheduler.kv
    row = kv.admit(LIMIT + 5)
    assert (kv.table.table[row] >= 0).all()
    slots = kv.table.table[row].tolist()
    assert len(set(slots)) == len(slots) == LIMIT + 5
    kv.release(row)
    assert kv.all_free()


def test_the_cache_container_builds_the_table_from_the_configured_limit():
    model = SimpleNamespace(config=SimpleNamespace(sliding_window=None, max_position_embeddings=4096))
    config = CacheConfig(page_size=16, max_total_tokens=1024, max_running_requests=4, max_prefill_tokens=512,
                         max_context_len=LIMIT)
    for lookahead in (0, 6):
        cache = CacheContainer(config=config, device=torch.device("cpu"), target_model=model,
                               lookahead_tokens=lookahead)
        kv = cache.manager()
        assert cache.max_context_len() == kv.max_context_len == LIMIT
        assert kv.table.table.shape == (4, LIMIT + lookahead)


def prompts_around_the_limit() -> list[list[int]]:
    """Token ids that repeat a motif (so prompt lookup finds drafts): one prompt well inside the
    context, then the lengths around its end."""
    rng = random.Random(0)
    motif = [rng.randrange(2, 320) for _ in range(11)]
    return [([0] + motif * 8)[:n] for n in (40, *AROUND_LIMIT)]


SPECULATIVE = {  # name -> (kind, num_steps, topk, num_draft_tokens), with the plain engine's cache settings
    "eagle chain": ("eagle", 3, 1, None),
    "eagle3 chain": ("eagle3", 5, 1, None),
    "eagle tree": ("eagle", 3, 2, 6),
    "eagle3 tree": ("eagle3", 5, 4, 16),
    "ngram chain": ("ngram", 4, 1, None),
    "ngram tree": ("ngram", 3, 2, 7),
}


def test_plain_decoding_admits_prompts_shorter_than_the_limit(spec_pair, plain_reference):
    with build_engine(engine_overrides(spec_pair[0], "none", *CACHE)) as eng:
        assert eng.scheduler.kv.max_context_len == LIMIT
    plain_outputs = plain_reference.outputs(spec_pair[0], prompts_around_the_limit(), PARAMS, *CACHE)
    assert [o.finish_reason for o in plain_outputs] == ["length", "length", "length", "error", "error"]
    assert [len(o.token_ids) for o in plain_outputs[:3]] == [LIMIT - 40, 2, 1]
    for out in plain_outputs[3:]:
        assert f"must be shorter than cache.max_context_len = {LIMIT}" in out.error


@pytest.mark.parametrize("name", list(SPECULATIVE))
def test_speculation_admits_refuses_and_emits_as_plain_decoding(spec_pair, plain_reference, name):
    target, heads = spec_pair
    kind, num_steps, topk, nodes = SPECULATIVE[name]
    overrides = engine_overrides(target, kind, *CACHE, head=heads.get(kind), num_steps=num_steps, topk=topk, nodes=nodes)
    with build_engine(overrides) as eng:
        kv = eng.scheduler.kv
        assert eng.scheduler.lookahead_tokens > 0
        assert kv.max_context_len == eng.stop_checker.max_context_len == LIMIT
        assert kv.table.table.shape[1] == LIMIT + eng.scheduler.lookahead_tokens
        outs = eng.generate(prompt_token_ids=prompts_around_the_limit(), sampling=PARAMS)
        assert kv.all_free() and (kv.table.table == -1).all()
    plain_outputs = plain_reference.outputs(target, prompts_around_the_limit(), PARAMS, *CACHE)
    assert [o.finish_reason for o in outs] == [o.finish_reason for o in plain_outputs]
    assert [o.error for o in outs] == [o.error for o in plain_outputs]
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain_outputs]
