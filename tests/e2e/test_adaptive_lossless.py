"""Adaptive speculation is lossless: greedy output equals plain decoding while the step count changes
under the running batch, and the shipped policies run end to end."""

import time

import pytest
import torch
from dependency_injector import providers
from support import build_engine, compose_config
from support.engines import DRAFT_KIND, PROMPTS, engine_overrides

from eyas import SamplingParams
from eyas.containers.build import build_container
from eyas.engine.phase_clock import CATCH_UP_PHASE, HOST_PHASE
from eyas.engine.request import Request
from eyas.engine.speculative.candidate import Candidate

# unequal lengths: the batch shrinks 5 -> 1 as requests finish, crossing tiers
PARAMS = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (90, 24, 44, 12, 52)]
TIERS = "adaptive.tiers=[{batch_size:2,candidates:[0,1,3,5]},{batch_size:8,candidates:[0,2,4]}]"
TREE_TIERS = ("adaptive.tiers=[{batch_size:4,candidates:[1,3,{num_steps:3,topk:2,num_draft_tokens:6},"
              "{num_steps:4,topk:4,num_draft_tokens:12}]},{batch_size:8,candidates:[0,2,{num_steps:2,topk:3,num_draft_tokens:7}]}]")
TREE_LABELS = {"3x2/6", "4x4/12", "2x3/7"}
# other drafters next to the configured head's chains and trees, in both tiers
OTHER_TIERS = ("adaptive.tiers=[{batch_size:4,candidates:[1,3,{num_steps:3,topk:2,num_draft_tokens:6},"
               "{drafter:ngram,num_steps:5},{drafter:ngram,num_steps:3,topk:2,num_draft_tokens:6},"
               "{drafter:hybrid,num_steps:2}]},{batch_size:8,candidates:[0,2,{drafter:ngram,num_steps:2},"
               "{drafter:hybrid,num_steps:3,topk:2,num_draft_tokens:12}]}]")
OTHER_LABELS = {"3x2/6", "ngram:5", "ngram:3x2/6", "hybrid:2", "ngram:2", "hybrid:3x2/12"}
# the hybrid configured: n-gram lookup alone is its other drafter
HYBRID_TIERS = ("adaptive.tiers=[{batch_size:4,candidates:[1,3,{num_steps:3,topk:2,num_draft_tokens:12},"
                "{drafter:ngram,num_steps:5},{drafter:ngram,num_steps:3,topk:2,num_draft_tokens:6}]},"
                "{batch_size:8,candidates:[0,2,{drafter:ngram,num_steps:2}]}]")
HYBRID_LABELS = {"3x2/12", "ngram:5", "ngram:3x2/6", "ngram:2"}


class CyclingPolicy:
    """Test policy: a different candidate every `every` cycles of its tier (walks the candidates up and down)."""

    needs_timings = False

    def __init__(self, candidates, initial, every=1):
        self.order = list(candidates) + list(reversed(candidates[1:-1]))
        self.every = every
        self.cycles = 0

    @property
    def choice(self) -> Candidate:
        return self.order[(self.cycles // self.every) % len(self.order)]

    def observe(self, candidate, accepted_drafts, timings):
        assert candidate == self.choice and all(0 <= n <= candidate.num_steps for n in accepted_drafts)
        self.cycles += 1


def switch_every_cycle(overrides: list[str], plain: list[list[int]]):
    """Generate PROMPTS with the CyclingPolicy in place of the configured one: output equals plain
    decoding's and every KV page is free after. Returns (engine, metrics)."""
    container = build_container(compose_config(overrides))
    container.make_policy.override(providers.Object(CyclingPolicy))
    engine = container.engine()
    outs = engine.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == plain
    assert engine.scheduler.kv.all_free()
    return engine, engine.metrics()


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_forced_switching_equals_plain(spec_pair, plain_reference, kind, page_size):
    target, heads = spec_pair
    _, metrics = switch_every_cycle(engine_overrides(target, kind, f"cache.page_size={page_size}", "adaptive=ema", TIERS,
                                                     head=heads[kind]), plain_reference(target, PROMPTS, PARAMS))
    # the batch shrinks from 5 (tier 8) to 1-2 (tier 2) as requests finish: both tiers ran
    assert set(metrics["adaptive_cycles_at_steps"]) == {0, 1, 2, 3, 4, 5}
    assert metrics["adaptive_switches"] >= 8


@pytest.mark.parametrize("algorithm,page_size", [("eagle", 1), ("eagle3", 16), ("hybrid", 16), ("ngram", 1)])
def test_forced_switching_between_chains_and_trees_equals_plain(spec_pair, plain_reference, algorithm, page_size):
    """Tree shapes as candidates: every switch chain <-> tree <-> tree rebinds the shape's prebuilt state,
    and the KV reserved ahead covers the largest tree of any candidate."""
    target, heads = spec_pair
    overrides = engine_overrides(target, algorithm, f"cache.page_size={page_size}", "adaptive=throughput", TREE_TIERS,
                                 head=heads.get(DRAFT_KIND.get(algorithm)))
    engine, metrics = switch_every_cycle(overrides, plain_reference(target, PROMPTS, PARAMS))
    assert set(metrics["adaptive_cycles_at_steps"]) == {0, 1, 2, 3} | TREE_LABELS
    assert engine.scheduler.lookahead_tokens == 13  # the 4x4 tree's draft frontiers: (4 - 1) * 4 + 1 columns


@pytest.mark.parametrize("algorithm,page_size", [("eagle3", 1), ("eagle", 16), ("hybrid", 1)])
def test_forced_switching_between_drafters_equals_plain(spec_pair, plain_reference, algorithm, page_size):
    """Other drafters as candidates: every switch between the head's chains and trees, n-gram lookup
    alone and the hybrid rebinds a prebuilt state, and each drafter catches up on what it sat out."""
    target, heads = spec_pair
    tiers, labels = (HYBRID_TIERS, HYBRID_LABELS) if algorithm == "hybrid" else (OTHER_TIERS, OTHER_LABELS)
    overrides = engine_overrides(target, algorithm, f"cache.page_size={page_size}", "adaptive=throughput", tiers,
                                 head=heads.get(DRAFT_KIND.get(algorithm)))
    engine, metrics = switch_every_cycle(overrides, plain_reference(target, PROMPTS, PARAMS))
    assert set(metrics["adaptive_cycles_at_steps"]) == {0, 1, 2, 3} | labels
    assert engine.scheduler.lookahead_tokens == 12  # the widest tree: the hybrid's 12 nodes


FROM_A_TREE = ["speculative.topk=4", "speculative.num_steps=4", "speculative.num_draft_tokens=12"]


@pytest.mark.parametrize("start,tiers,explored", [
    ([], TREE_TIERS, ("3x2/6", "4x4/12")),
    (FROM_A_TREE, TREE_TIERS, ("3x2/6", "4x4/12")),
    ([], OTHER_TIERS, ("ngram:5", "hybrid:2")),
], ids=["trees from a chain", "trees from a tree", "other drafters"])
def test_throughput_policy_with_other_candidates_is_lossless_greedy_and_sampled(spec_pair, plain_reference, start,
                                                                                tiers, explored):
    target, heads = spec_pair
    overrides = engine_overrides(target, "eagle3", *start, "adaptive=throughput", tiers, "adaptive.update_interval=2",
                                 "adaptive.probe_interval=2", head=heads["eagle3"])
    params = [SamplingParams(max_new_tokens=n, temperature=t, seed=i, ignore_eos=True)
              for i, (n, t) in enumerate(zip((100, 24, 72, 12, 88), (0.0, 1.0, 0.0, 0.8, 1.0)))]
    plain = plain_reference(target, PROMPTS, params)
    with build_engine(overrides) as eng:
        outs = eng.generate(PROMPTS, params)
        counts = eng.metrics()["adaptive_cycles_at_steps"]
    assert [o.token_ids for o in outs] == plain
    assert all(counts.get(label, 0) > 0 for label in explored), counts  # each was explored


@pytest.mark.parametrize("policy", ["ema", "throughput"])
def test_shipped_policies_are_lossless(spec_pair, plain_reference, policy):
    target, heads = spec_pair
    overrides = engine_overrides(target, "eagle", f"adaptive={policy}", TIERS, "adaptive.update_interval=2",
                                 "adaptive.warmup_batches=2", "adaptive.probe_interval=2", head=heads["eagle"])
    with build_engine(overrides) as eng:
        outs = eng.generate(PROMPTS, PARAMS)
        metrics = eng.metrics()
    assert [o.token_ids for o in outs] == plain_reference(target, PROMPTS, PARAMS)
    assert metrics["adaptive_switches"] >= 1


def test_adaptive_sampling_is_seeded_whatever_the_schedule(spec_pair, plain_reference):
    """The throughput policy's step counts follow wall-clock timings, so two runs take different
    schedules; seeded sampled tokens still equal plain decoding's, run after run."""
    target, heads = spec_pair
    overrides = engine_overrides(target, "eagle3", "adaptive=throughput", TIERS, "adaptive.update_interval=2",
                                 head=heads["eagle3"])
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=11, ignore_eos=True)
    plain = plain_reference(target, PROMPTS[:3], params)
    for _ in range(2):
        with build_engine(overrides) as eng:
            assert [o.token_ids for o in eng.generate(PROMPTS[:3], params)] == plain
            assert eng.metrics()["adaptive_switches"] >= 1
    assert all(len(t) == 24 for t in plain)


def test_held_draft_extend_equals_running_it_every_iteration(spec_pair):
    """What 0 steps holds back and replays in one forward leaves the draft KV and the next proposal as
    running draft-extend after every iteration would."""
    target, heads = spec_pair
    results = []
    for replay in (False, True):
        with build_engine(engine_overrides(target, "eagle3", head=heads["eagle3"])) as eng:
            worker = eng.worker
            drafter, head = worker.drafter, worker.drafter.head
            request = Request(0, [0, 5, 9, 14, 3], SamplingParams(max_new_tokens=8))
            eng.scheduler.add(request)
            (req,) = eng.scheduler.schedule()
            worker.prefill([req])
            row, n = req.row, req.num_computed
            gen = torch.Generator().manual_seed(0)
            hidden = head.model.config.hidden_size
            steps = [([int(t)], torch.randn(1, hidden, generator=gen)) for t in torch.randint(0, 200, (4,), generator=gen)]
            for i, (tokens, features) in enumerate(steps):
                if replay:
                    drafter.deferred.hold([row], [n + i], [tokens], features)
                else:
                    head.extend([row], [n + i], [tokens], features)
            if replay:
                head.extend(*drafter.deferred.take([row]))
                assert len(drafter.deferred) == 0
            slots = worker.req_to_token[row, : n + len(steps)]
            pool = head.runner.kv_pool
            results.append((pool.k[0][slots].clone(), pool.v[0][slots].clone(),
                            *[t.clone() for t in head.buffers.load(torch.tensor([row]))]))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def engine_with_policy(spec_pair, policy, *extra, kind="eagle"):
    target, heads = spec_pair
    config = compose_config(engine_overrides(target, kind, "adaptive=throughput", TIERS, *extra, head=heads[kind]))
    container = build_container(config)
    container.make_policy.override(providers.Object(policy))
    return container.engine()


@pytest.mark.parametrize("sat_out", [Candidate(0), Candidate(4, drafter="ngram")], ids=["0 steps", "n-gram"])
def test_sitting_out_holds_draft_work_per_row_and_a_new_request_starts_clean(spec_pair, sat_out):
    """At 0 steps, or while n-gram lookup drafts, no draft forward runs per iteration: the verified
    tokens wait, per request row, for the next iteration the head drafts; a request that ends lets go of
    what waited in its row, and one admitted into that row never inherits it."""
    engine = engine_with_policy(spec_pair, lambda candidates, initial: CyclingPolicy([sat_out], sat_out),
                                "adaptive.tiers=[{batch_size:8,candidates:[0,3,{drafter:ngram,num_steps:4}]}]")
    worker = engine.worker
    runner = worker.drafter.head.runner
    calls = []
    forward = runner.forward
    runner.forward = lambda *a, **kw: calls.append(1) or forward(*a, **kw)
    deferred = worker.drafter.eagle.deferred  # the hybrid's head
    held, release = [], worker.drafter.release
    worker.drafter.release = lambda request: held.append(deferred.take([request.row])) or release(request)
    params = SamplingParams(max_new_tokens=9, ignore_eos=True)
    engine.generate(["def add(a, b):"], params)  # held work in row 0 until it ends
    assert held[0] is not None and deferred.take([0]) is None  # let go of when it ended
    deferred.hold(*held[0][:3], held[0][3])  # (as if it were still there: the next request must not see it)
    out = engine.generate(["import os"], params)[0]  # admitted into row 0 again
    rows, starts, tokens, features = held[1]
    # prefill extended the draft head up to the first output token; each verify since then emitted one
    # token, held from the position after the prompt onwards; nothing of the first request is left
    assert rows == [0] and starts == [len(out.prompt_token_ids)] and tokens == [out.token_ids[1:]]
    assert features.shape[0] == len(out.token_ids) - 1
    assert len(calls) == 2  # the two prefills' draft-extends only


def test_an_eagle3_head_projects_no_features_in_cycles_it_sits_out(spec_pair):
    """At 0 steps an EAGLE-3 head's draft-extend is held with its three target layers unprojected ([n, 3H]):
    a tier that sits at 0 never runs the head's fc; the catch-up before it next drafts projects them all."""
    engine = engine_with_policy(spec_pair, lambda candidates, initial: CyclingPolicy([Candidate(0)], Candidate(0)),
                                "adaptive.tiers=[{batch_size:8,candidates:[0,3]}]", kind="eagle3")
    head = engine.worker.drafter.head
    projected = []
    fc = head.model.fc_proj
    head.model.fc_proj = lambda x: projected.append(x.shape[0]) or fc(x)
    out = engine.generate(["def add(a, b):"], SamplingParams(max_new_tokens=9, ignore_eos=True))[0]
    assert projected == [len(out.prompt_token_ids)]  # the prefill's draft-extend only
    assert engine.worker.drafter.deferred.take([0]) is None  # let go of when the request ended
    hidden = engine.worker.target_runner.model.config.hidden_size
    engine.worker.drafter.release = lambda request: None  # keep the held work of the next request
    out = engine.generate(["import os"], SamplingParams(max_new_tokens=9, ignore_eos=True))[0]
    _, _, tokens, features = engine.worker.drafter.deferred.take([0])
    assert tokens == [out.token_ids[1:]] and features.shape == (len(out.token_ids) - 1, 3 * hidden)


def test_throughput_policy_gets_every_phase_time(spec_pair):
    seen = []

    class Recording(CyclingPolicy):
        def observe(self, candidate, accepted_drafts, timings):
            seen.append(dict(timings))
            super().observe(candidate, accepted_drafts, timings)

    engine = engine_with_policy(spec_pair, lambda candidates, initial: Recording(candidates, initial))
    start = time.perf_counter()
    engine.generate(PROMPTS, PARAMS)
    wall = time.perf_counter() - start
    phases = {CATCH_UP_PHASE, "draft", "verify", "extend"}
    assert seen and all(set(t) - {HOST_PHASE} == phases for t in seen)
    # the host's time between cycles, from the second cycle of a run of decode steps on
    assert sum(HOST_PHASE in t for t in seen) >= len(seen) // 2
    assert all(0 <= v for t in seen for v in t.values())
    assert sum(sum(t.values()) for t in seen) <= wall
    assert all(t["verify"] > 0 for t in seen)


def test_catching_up_on_cycles_sat_out_runs_before_drafting(spec_pair):
    """Work held while the head sat out is caught up in `prepare`, before the cycle drafts (the worker
    times it as the catch-up phase, which the throughput policy keeps out of the candidate's cost);
    a cycle that drafts starts with none of it left, and a 0-step cycle catches nothing up."""
    engine = engine_with_policy(spec_pair, lambda candidates, initial: CyclingPolicy(candidates, initial, every=2))
    drafter, cycles = engine.worker.drafter, []
    prepare = drafter.prepare

    def recording(requests, state):
        rows = [r.row for r in requests]
        before = drafter.deferred.sat_out(rows)
        prepare(requests, state)
        cycles.append((state.candidate.num_steps, before, drafter.deferred.sat_out(rows)))

    drafter.prepare = recording
    engine.generate(PROMPTS, PARAMS)
    assert any(k > 0 and before for k, before, _ in cycles)  # some cycle drafted after sitting out
    assert all(not after for k, _, after in cycles if k > 0)
    assert any(before for k, before, _ in cycles if k == 0)  # a second 0-step cycle in a row holds work...
    assert all(before == after for k, before, after in cycles if k == 0)  # ... and leaves it held


@pytest.mark.parametrize("sat_out,drafting", [(Candidate(0), Candidate(3)), (Candidate(0), Candidate(3, 2, 6)),
                                              (Candidate(4, drafter="ngram"), Candidate(3)),
                                              (Candidate(4, drafter="ngram"), Candidate(3, 2, 6))],
                         ids=["0 steps, chain", "0 steps, tree", "n-gram, chain", "n-gram, tree"])
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_draft_kv_after_sitting_out_equals_always_extending(spec_pair, sat_out, drafting, kind):
    """Switching every cycle between a candidate where the head sits out (0 steps, or n-gram lookup
    drafting) and one where it drafts (a chain or a tree) leaves the draft KV of every committed position
    as drafting throughout does: held work is replayed, all of it, at the right positions (an EAGLE-3
    head's held features unprojected until then)."""
    tiers = ("adaptive.tiers=[{batch_size:8,candidates:[0,3,{num_steps:3,topk:2,num_draft_tokens:6},"
             "{drafter:ngram,num_steps:4}]}]")
    pools = []
    for order in ([sat_out, drafting], [drafting]):
        engine = engine_with_policy(spec_pair, lambda candidates, initial: CyclingPolicy(order, order[0]), tiers,
                                    kind=kind)
        out = engine.generate(["class Point:\n    def __init__(self, x, y):"], SamplingParams(max_new_tokens=40,
                                                                                                ignore_eos=True))[0]
        drafter = engine.worker.drafter
        held = getattr(drafter, "eagle", drafter).deferred.take([0])  # the hybrid's head, or the head's own
        covered = held[1][0] if held is not None else len(out.prompt_token_ids) + len(out.token_ids) - 1
        pool = engine.worker.drafter.head.runner.kv_pool  # one request from an empty pool: slot = position
        # what waits is at most the last cycle's tokens: nothing held was left behind by a drafting cycle
        assert covered >= len(out.prompt_token_ids) + len(out.token_ids) - 1 - 5
        # the last cycle's positions are left out: the request ends inside it (max_new_tokens), and where
        # that cycle starts, so which of its positions are extended before the end, differs between the runs
        last_cycle_start = len(out.prompt_token_ids) + len(out.token_ids) - 1 - 5  # <= 5 tokens a cycle here
        pools.append((min(covered, last_cycle_start), pool.k[0].clone(), pool.v[0].clone()))
    (covered, k_switching, v_switching), (_, k_always, v_always) = pools
    assert covered > 20
    torch.testing.assert_close(k_switching[:covered], k_always[:covered], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v_switching[:covered], v_always[:covered], atol=1e-5, rtol=1e-5)
