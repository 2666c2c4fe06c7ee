"""Prefix caching: shared pages are counted exactly, never written, evicted before anyone is preempted,
and reused KV (the target's and the draft's) changes no output and no acceptance."""

import random

import pytest
from support import build_engine
from support.engines import DRAFTER_CASES, draft_head, engine_overrides

from eyas import SamplingParams
from eyas.engine.cache.allocator import PageAllocator
from eyas.engine.cache.manager import KVCacheManager
from eyas.engine.cache.prefix_cache import PrefixCache
from eyas.engine.cache.req_to_token import ReqToTokenTable

GREEDY = SamplingParams(max_new_tokens=12, ignore_eos=True)


class _Sequence:
    """A simulated request: its tokens, its row, and how far its KV is final."""

    def __init__(self, tokens: list[int]):
        self.tokens = tokens
        self.row = None
        self.valid = 0


def _check_accounting(kv: KVCacheManager, live: list[_Sequence]) -> None:
    """Every page is free, cached, or private to one row; each cached page's count is its holders'."""
    cache = kv.prefix_cache
    free = set(kv.allocator._free)
    nodes, stack = [], list(cache.root.children.values())
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())
        assert node.refs <= node.parent.refs or node.parent is cache.root  # holders hold the whole path
    cached = {n.page for n in nodes}
    assert len(cached) == len(nodes) == cache.num_pages
    assert cache.num_evictable == sum(n.refs == 0 for n in nodes)
    holders = {id(n): 0 for n in nodes}
    private = []
    for seq in live:
        pages = kv._rows[seq.row]
        for node in pages.nodes:
            holders[id(node)] += 1
        private += pages.pages[len(pages.nodes):]
        assert [n.page for n in pages.nodes] == pages.pages[:len(pages.nodes)]
    assert all(n.refs == holders[id(n)] for n in nodes)
    assert len(private) == len(set(private)) and not set(private) & (free | cached)
    assert free | cached | set(private) == set(range(kv.allocator.num_pages))
    assert not free & cached


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("seed", range(6))
def test_random_admit_share_evict_preempt_abort_sequences_keep_exact_accounting(page_size, seed):
    """Simulated KV: slot s holds the tokens up to the one after its position (what the target's and an
    EAGLE head's KV there depend on). A request admitted onto cached pages must find its own prefix's
    KV there, and no request ever writes a page the cache holds."""
    rng = random.Random(seed)
    allocator = PageAllocator(48 // page_size * 2)
    table = ReqToTokenTable(max_requests=6, max_context_len=60, lookahead_tokens=4, device="cpu")
    kv = KVCacheManager(allocator, table, page_size, PrefixCache(allocator, page_size))
    content: dict[int, tuple] = {}  # slot -> the tokens its KV was computed from
    prefixes = [[rng.randrange(5) for _ in range(rng.randrange(4, 30))] for _ in range(4)]
    live, waiting = [], []
    hits = evicted = 0

    def cached_pages() -> set[int]:
        pages, stack = set(), list(kv.prefix_cache.root.children.values())
        while stack:
            node = stack.pop()
            pages.add(node.page)
            stack.extend(node.children.values())
        return pages

    def write(seq: _Sequence, upto: int) -> None:
        """Compute positions seq.valid .. upto - 1 (the token after each must be known)."""
        cached = cached_pages()
        for p in range(seq.valid, upto):
            slot = int(table.table[seq.row, p])
            assert slot // page_size not in cached, "a request wrote a page the cache holds"
            content[slot] = tuple(seq.tokens[:p + 2])
        seq.valid = upto

    for _ in range(400):
        op = rng.random()
        if op < 0.3 and len(live) < 6:
            seq = waiting.pop() if waiting and rng.random() < 0.5 else \
                _Sequence(rng.choice(prefixes)[:rng.randrange(1, 30)] + [rng.randrange(5) for _ in range(rng.randrange(1, 12))])
            matched = kv.match(seq.tokens)
            need = len(seq.tokens) + 4
            if kv.can_admit(need, matched):
                before = kv.cached_pages
                seq.row = kv.admit(need, matched)
                evicted += before - kv.cached_pages
                seq.valid = len(matched) * page_size
                hits += bool(matched)
                for p in range(seq.valid):  # the reused KV is this request's own prefix's
                    assert content[int(table.table[seq.row, p])] == tuple(seq.tokens[:p + 2])
                write(seq, len(seq.tokens) - 1)
                live.append(seq)
            else:
                waiting.append(seq)
        elif op < 0.65 and live:  # a decode step: one token, the KV before it final
            seq = rng.choice(live)
            seq.tokens.append(rng.randrange(5))
            before = kv.cached_pages
            grown = kv.grow(seq.row, len(seq.tokens) + 4)
            evicted += before - kv.cached_pages
            if grown:
                write(seq, len(seq.tokens) - 1)
                if rng.random() < 0.5:
                    kv.cache(seq.row, seq.tokens, seq.valid)
            else:  # preempted: its KV joins the cache and it waits
                live.remove(seq)
                kv.release(seq.row, seq.tokens, seq.valid)
                seq.valid = 0
                waiting.append(seq)
        elif op < 0.85 and live:  # finishes
            seq = live.pop(rng.randrange(len(live)))
            kv.release(seq.row, seq.tokens, seq.valid)
        elif live:  # aborted mid-step: nothing of it is cached
            seq = live.pop(rng.randrange(len(live)))
            kv.release(seq.row)
        _check_accounting(kv, live)
    for seq in live:
        kv.release(seq.row, seq.tokens, seq.valid)
    assert kv.all_free() and hits > 0 and evicted > 0
    kv.clear_cache()
    assert allocator.num_free_pages == allocator.num_pages and kv.prefix_cache.num_pages == 0


def test_eviction_takes_the_least_recently_used_leaf_first():
    allocator = PageAllocator(8)
    table = ReqToTokenTable(max_requests=4, max_context_len=16, lookahead_tokens=0, device="cpu")
    kv = KVCacheManager(allocator, table, 2, PrefixCache(allocator, 2))
    for tokens in ([1, 2, 3, 4, 5], [7, 8, 9, 1, 2], [1, 2, 3, 9, 9]):
        row = kv.admit(len(tokens), kv.match(tokens))
        kv.release(row, tokens, len(tokens) - 1)
    # pages: [1,2|3] shared, then [3,4|5], [7,8|9], [9,1|2], [3,9|9]: five cached, three free
    assert kv.cached_pages == 5 and allocator.num_free_pages == 3
    row = kv.admit(5 * 2, kv.match([7, 8, 9]))  # holds [7,8|9]; needs 4 more pages, so one is evicted
    assert kv.cached_pages == 4
    assert [n.key for n in kv.match([1, 2, 3, 4, 5])] == [(1, 2, 3)]  # the oldest leaf went first
    assert len(kv.match([7, 8, 9, 1, 2])) == 2 and len(kv.match([1, 2, 3, 9, 9])) == 2
    kv.release(row)
    assert kv.all_free()


def _sequential(overrides, prompts, params):
    """Each prompt in a generate call of its own (so later ones can reuse earlier ones' KV)."""
    with build_engine(overrides) as eng:
        outs = [eng.generate(prompt_token_ids=[p], sampling=params)[0] for p in prompts]
        assert eng.scheduler.kv.all_free()
        return outs, eng.metrics()


def _shared_prefix_prompts(seed: int, count: int = 6) -> list[list[int]]:
    rng = random.Random(seed)
    system = [0] + [rng.randrange(2, 320) for _ in range(40)]
    history = list(system)
    prompts = []
    for _ in range(count):  # a growing conversation and unrelated turns sharing the system prompt
        turn = [rng.randrange(2, 320) for _ in range(rng.randrange(1, 9))]
        history = history + turn
        prompts.append(list(history) if rng.random() < 0.7 else system + turn)
    return prompts


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("algorithm, shape", DRAFTER_CASES, ids=[c[0] for c in DRAFTER_CASES])
def test_reused_prefixes_change_no_output_and_no_acceptance(spec_pair, algorithm, shape, page_size):
    """Greedy outputs and every request's acceptance equal an engine without the cache: the draft KV
    reused with the target's is what the head would have computed."""
    target, heads = spec_pair
    head = draft_head(algorithm, target, heads)
    prompts = _shared_prefix_prompts(page_size)
    base = engine_overrides(target, algorithm, f"cache.page_size={page_size}", head=head, **shape)
    cached, metrics = _sequential(base, prompts, GREEDY)
    uncached, _ = _sequential([*base, "cache.prefix_caching=false"], prompts, GREEDY)
    assert [o.token_ids for o in cached] == [o.token_ids for o in uncached]
    assert sum(o.stats["cached_tokens"] for o in cached[1:]) >= 40 * (len(prompts) - 1) - page_size * len(prompts)
    assert all(o.stats["cached_tokens"] < o.stats["prompt_tokens"] for o in cached)
    assert 0 < metrics["prefix_cache_hit_rate"] < 1
    if algorithm != "none":
        spec = ("num_verify_cycles", "mean_accept_length", "draft_accept_rate")
        assert [[o.stats[k] for k in spec] for o in cached] == [[o.stats[k] for k in spec] for o in uncached]


def test_preemption_and_eviction_under_a_tight_pool_keep_outputs(spec_pair):
    """A pool too small for the batch: cached pages are evicted before anyone is preempted, preempted
    requests come back onto their own cached KV, and every output equals the uncached engine's."""
    target, heads = spec_pair
    rng = random.Random(4)
    system = [0] + [rng.randrange(2, 320) for _ in range(30)]
    prompts = [system + [rng.randrange(2, 320) for _ in range(rng.randrange(1, 20))] for _ in range(24)]
    params = [SamplingParams(max_new_tokens=rng.randrange(4, 30), temperature=rng.choice([0.0, 0.8]), seed=i,
                             ignore_eos=True) for i in range(24)]
    base = engine_overrides(target, "eagle", "cache.page_size=4", "cache.max_total_tokens=320",
                            "cache.max_running_requests=12", head=heads["eagle"])
    runs = {}
    for caching in ("true", "false"):
        with build_engine([*base, f"cache.prefix_caching={caching}"]) as eng:
            first = eng.generate(prompt_token_ids=prompts[:4], sampling=params[:4])
            rest = eng.generate(prompt_token_ids=prompts[4:], sampling=params[4:])
            assert eng.scheduler.kv.all_free()
            runs[caching] = ([o.token_ids for o in first + rest], eng.metrics(), rest)
    assert runs["true"][0] == runs["false"][0]
    metrics = runs["true"][1]
    assert metrics["preemptions"] > 0 and metrics["cached_prompt_tokens"] >= 20 * 28
    assert all(o.stats["cached_tokens"] >= 28 for o in runs["true"][2])


def test_n_samples_and_a_cached_prefix_together(spec_pair):
    target, heads = spec_pair
    prompt = [0] + list(range(10, 60))
    params = SamplingParams(max_new_tokens=10, temperature=0.9, seed=3, n=3, ignore_eos=True)
    base = engine_overrides(target, "eagle", "cache.page_size=4", head=heads["eagle"])
    outs = {}
    for caching in ("true", "false"):
        with build_engine([*base, f"cache.prefix_caching={caching}"]) as eng:
            eng.generate(prompt_token_ids=[prompt[:30]], sampling=GREEDY)
            outs[caching] = eng.generate(prompt_token_ids=[prompt], sampling=params)
            assert eng.scheduler.kv.all_free()
    assert [o.token_ids for o in outs["true"]] == [o.token_ids for o in outs["false"]]
    assert [o.stats["cached_tokens"] for o in outs["true"]] == [28] * 3


@pytest.mark.parametrize("algorithm", ["none", "eagle"])
def test_n_samples_hold_one_copy_of_their_prompt(spec_pair, algorithm):
    """After the step that prefilled a prompt once for its n samples, the other samples give back their
    copies of its whole pages and hold the first sample's (cached) ones: one prompt's KV and a private
    tail each, and the tokens of the run without a prefix cache (where the copies stay)."""
    target, heads = spec_pair
    prompt = [0] + list(range(10, 60))  # 51 tokens: 12 whole pages of 4, a tail page
    params = SamplingParams(max_new_tokens=10, temperature=0.9, seed=3, n=3, ignore_eos=True)
    base = engine_overrides(target, algorithm, "cache.page_size=4", head=heads.get(algorithm))
    outs, held = {}, {}
    for caching in ("true", "false"):
        with build_engine([*base, f"cache.prefix_caching={caching}"]) as eng:
            requests = eng.submit(prompt_token_ids=[prompt], sampling=params)
            eng.step()  # the prefill
            held[caching] = eng.scheduler.kv.used_pages
            rows = [list(eng.scheduler.kv._rows[r.row].pages) for r in requests]  # as the prefill step left them
            while eng.has_work():
                eng.step()
            outs[caching] = [r.output_ids for r in requests]
            assert eng.scheduler.kv.all_free()
        if caching == "true":  # the first 12 pages are one set of pages, each sample's tail its own
            assert rows[1][:12] == rows[2][:12] == rows[0][:12] and len({r[12] for r in rows}) == 3
    assert outs["true"] == outs["false"] and len({tuple(o) for o in outs["true"]}) == 3
    assert held["false"] - held["true"] == 2 * 12


def test_prefix_caching_must_be_a_boolean(checkpoint):
    from eyas.engine.errors import ConfigError
    with pytest.raises(ConfigError, match=r"cache\.prefix_caching[\s\S]*not a valid bool"):
        build_engine(engine_overrides(checkpoint("gqa"), "none", "cache.prefix_caching=maybe"))


@pytest.mark.parametrize("seed", [0, 1])
def test_random_admissions_and_aborts_change_no_greedy_output(spec_pair, seed):
    """Requests sharing prefixes arrive in waves into a pool too small for them, some are aborted midway:
    every one that finishes emits what it emits without the cache, and no page is held afterwards."""
    target, heads = spec_pair
    rng = random.Random(seed)
    systems = [[0] + [rng.randrange(2, 320) for _ in range(rng.randrange(8, 40))] for _ in range(3)]
    prompts = [rng.choice(systems)[:rng.randrange(4, 40)] + [rng.randrange(2, 320) for _ in range(rng.randrange(1, 8))]
               for _ in range(40)]
    params = [SamplingParams(max_new_tokens=rng.randrange(2, 20), ignore_eos=True) for _ in prompts]
    plan = [(rng.randrange(1, 6), rng.random() < 0.3) for _ in range(20)]  # per wave: steps run, abort one?
    base = engine_overrides(target, "eagle3", "cache.page_size=4", "cache.max_total_tokens=320",
                            "cache.max_running_requests=8", "cache.max_prefill_tokens=24", head=heads["eagle3"])
    results = {}
    for caching in ("true", "false"):
        with build_engine([*base, f"cache.prefix_caching={caching}"]) as eng:
            requests = []
            for wave, (steps, abort) in enumerate(plan):
                requests += eng.submit(prompt_token_ids=prompts[2 * wave:2 * wave + 2], sampling=params[2 * wave:2 * wave + 2])
                for _ in range(steps):
                    if eng.has_work():
                        eng.step()
                if abort:
                    eng.abort([requests[(wave * 7) % len(requests)]])
            while eng.has_work():
                eng.step()
            assert eng.scheduler.kv.all_free()
            results[caching] = [eng.output(r) for r in requests]
    kept = [i for i in range(len(prompts)) if all(results[c][i].finish_reason != "abort" for c in results)]
    assert len(kept) > 25
    assert [results["true"][i].token_ids for i in kept] == [results["false"][i].token_ids for i in kept]
    assert sum(o.stats["cached_tokens"] for o in results["true"]) > 100


@pytest.mark.parametrize("algorithm", ["none", "eagle"])
def test_requests_arriving_together_with_one_system_prompt_compute_it_once(spec_pair, algorithm):
    """Admitted in the same step, each would prefill the shared system prompt; the scheduler admits the
    others a step later, onto its cached pages, and the greedy tokens are the uncached engine's."""
    target, heads = spec_pair
    rng = random.Random(5)
    system = [0] + [rng.randrange(2, 320) for _ in range(47)]
    prompts = [system + [rng.randrange(2, 320) for _ in range(3 + i)] for i in range(4)] + [system + [7, 8, 9]] * 2
    base = engine_overrides(target, algorithm, "cache.page_size=8", head=draft_head(algorithm, target, heads))
    outs = {}
    for caching in ("true", "false"):
        with build_engine([*base, f"cache.prefix_caching={caching}"]) as eng:
            outs[caching] = eng.generate(prompt_token_ids=prompts, sampling=GREEDY)
            assert eng.scheduler.kv.all_free()
    assert [o.token_ids for o in outs["true"]] == [o.token_ids for o in outs["false"]]
    cached = [o.stats["cached_tokens"] for o in outs["true"]]
    # the system prompt's pages but its last, which the cache keys with the token after it (the tails differ)
    assert cached[0] == 0 and all(c == len(system) - 8 for c in cached[1:5]), cached
    assert cached[5] == cached[4]  # identical prompts are admitted together (their prefill is shared)


def test_requests_sharing_only_a_few_pages_past_the_cache_are_admitted_together(spec_pair):
    """Two questions starting alike after a cached system prompt share a page or two: not worth a step of
    latency, so both are admitted at once; a longer shared prompt still holds the second back a step."""
    target, _ = spec_pair
    rng = random.Random(6)
    system = [0] + [rng.randrange(2, 320) for _ in range(47)]  # 6 pages of 8: 5 cached once it has run
    opening = [rng.randrange(2, 320) for _ in range(9)]  # + the 6th page: 2 pages and a token past the cache
    with build_engine(engine_overrides(target, "none", "cache.page_size=8")) as eng:
        eng.generate(prompt_token_ids=[system + [5, 6, 7]], sampling=GREEDY)
        tails = [[rng.randrange(2, 320) for _ in range(6)] for _ in range(2)]
        requests = eng.submit(prompt_token_ids=[system + opening + tail for tail in tails], sampling=GREEDY)
        eng.step()
        assert all(r.num_cached_tokens == 40 for r in requests)  # both admitted in the first step
        while eng.has_work():
            eng.step()
        long_opening = [rng.randrange(2, 320) for _ in range(40)]  # 6 pages past the cache
        requests = eng.submit(prompt_token_ids=[system + long_opening + tail for tail in tails], sampling=GREEDY)
        eng.step()
        assert requests[0].num_cached_tokens == 40 and requests[1].num_cached_tokens is None  # held a step
        while eng.has_work():
            eng.step()
        assert requests[1].num_cached_tokens == 40 + 40  # and then found the shared pages cached
        assert eng.scheduler.kv.all_free()
