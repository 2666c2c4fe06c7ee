"""EAGLE-2 draft trees (topk > 1): lossless against plain decoding at batch 16, greedy and seeded
sampling, on both attention backends; the tree's parts against references; KV exact after trees."""

import random
from pathlib import Path

import pytest
import torch
from support import build_engine
from support.engines import PARAMS_16, PROMPTS, PROMPTS_16, engine_overrides

from eyas import ConfigError, SamplingParams
from eyas.engine.speculative.candidate import Candidate
from eyas.engine.speculative.tree import DraftTree, ancestor_mask, max_tree_nodes, select_tree
from eyas.engine.speculative.verify import walk_tree

SHAPES = [(2, 4, 10), (4, 5, 16), (8, 3, 24)]  # topk, num_steps, num_draft_tokens


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("topk,steps,nodes", SHAPES)
def test_trees_are_lossless_at_batch_16(spec_pair, plain_reference, kind, topk, steps, nodes):
    target, heads = spec_pair
    with build_engine(engine_overrides(target, kind, head=heads[kind], num_steps=steps, topk=topk, nodes=nodes)) as eng:
        outs = eng.generate(PROMPTS_16, PARAMS_16)
        assert eng.worker.state.candidate == Candidate(steps, topk, nodes)
        assert eng.metrics()["mean_accept_length"] > 1.3
        assert eng.scheduler.kv.all_free()
    assert [o.token_ids for o in outs] == plain_reference(target, PROMPTS_16, PARAMS_16)


@pytest.mark.parametrize("draft_sampling", ["greedy", "sample"])
def test_trees_with_one_token_pages_and_either_draft_sampling(spec_pair, plain_reference, draft_sampling):
    target, heads = spec_pair
    overrides = engine_overrides(target, "eagle3", "cache.page_size=1", f"speculative.draft_sampling={draft_sampling}",
                                 head=heads["eagle3"], num_steps=5, topk=4, nodes=16)
    with build_engine(overrides) as eng:
        outs = eng.generate(PROMPTS_16, PARAMS_16)
    assert [o.token_ids for o in outs] == plain_reference(target, PROMPTS_16, PARAMS_16)


@pytest.mark.slow  # the Triton interpreter
def test_trees_on_the_triton_backend_equal_plain(spec_pair, plain_reference):
    target, heads = spec_pair
    overrides = engine_overrides(target, "eagle", "attention=triton", head=heads["eagle"], num_steps=3, topk=2, nodes=6)
    params = [SamplingParams(max_new_tokens=10, ignore_eos=True)] * 3
    expected = plain_reference(target, PROMPTS[:3], params)
    with build_engine(overrides) as eng:
        assert [o.token_ids for o in eng.generate(PROMPTS[:3], params)] == expected


def test_no_kv_leak_after_300_random_requests_with_trees(spec_pair, plain_reference):
    target, heads = spec_pair
    rng = random.Random(2)
    prompts = [[0] + [rng.randrange(2, 320) for _ in range(rng.randrange(1, 30))] for _ in range(300)]
    params = [SamplingParams(max_new_tokens=rng.randrange(1, 24), temperature=rng.choice([0.0, 0.8]), seed=i,
                             stop=rng.choice([[], ["e"]]), ignore_eos=rng.random() < 0.7) for i in range(300)]
    overrides = engine_overrides(target, "eagle", "cache.page_size=16", "cache.max_total_tokens=1024",
                                 "cache.max_running_requests=24", head=heads["eagle"], num_steps=4, topk=4, nodes=12)
    with build_engine(overrides) as eng:
        outs = eng.generate(prompt_token_ids=prompts, sampling=params)
        assert all(o.finish_reason in ("stop", "length") for o in outs)
        kv = eng.scheduler.kv
        assert kv.all_free() and (kv.table.table == -1).all()
    assert [o.token_ids for o in outs] == plain_reference(target, prompts, params)


# ---- the parts ----

def random_parents(rng: random.Random, b: int, n: int) -> torch.Tensor:
    return torch.tensor([[-1] + [rng.randrange(0, j) for j in range(1, n)] for _ in range(b)])


def test_ancestor_mask_against_walking_up():
    rng = random.Random(0)
    for _ in range(30):
        parents = random_parents(rng, rng.randrange(1, 4), rng.randrange(1, 20))
        expected = torch.zeros(*parents.shape, parents.shape[1], dtype=torch.bool)
        for b, row in enumerate(parents.tolist()):
            for j in range(len(row)):
                i = j
                while i >= 0:
                    expected[b, j, i] = True
                    i = row[i]
        assert torch.equal(ancestor_mask(parents), expected)


def test_select_tree_keeps_ancestors_even_on_ties():
    # candidates 0, 1 children of the root; 2, 3 of candidate 0; 4 of candidate 2 with log-prob 0 (a tie)
    tokens = torch.tensor([[10, 11, 12, 13, 14]])
    parents = torch.tensor([[-1, -1, 0, 0, 2]])
    scores = torch.tensor([[-0.1, -2.0, -0.5, -3.0, -0.5]])
    depths = torch.tensor([[1, 1, 2, 2, 3]])
    tree = select_tree(torch.tensor([7]), tokens, parents, scores, depths, num_nodes=4)
    assert tree.tokens.tolist() == [[7, 10, 12, 14]]
    assert tree.parents.tolist() == [[-1, 0, 1, 2]] and tree.depths.tolist() == [[0, 1, 2, 3]]


def walk_reference(tokens, parents, target):
    path = [0]
    while True:
        node = path[-1]
        child = next((j for j in range(len(tokens)) if parents[j] == node and tokens[j] == target[node]), None)
        if child is None:
            return path
        path.append(child)


@pytest.mark.parametrize("seed", range(4))
def test_walk_tree_against_a_reference_and_the_kernel(seed):
    rng = random.Random(seed)
    b, n, vocab = 6, rng.randrange(2, 24), 3
    parents = random_parents(rng, b, n)
    depths = torch.zeros_like(parents)
    for j in range(1, n):
        depths[:, j] = depths.gather(1, parents[:, j:j + 1])[:, 0] + 1
    tokens = torch.randint(vocab, (b, n), generator=torch.Generator().manual_seed(seed))
    for r in range(b):  # siblings hold distinct tokens, as a drafter proposes them
        seen = {}
        for j in range(1, n):
            key = int(parents[r, j])
            while int(tokens[r, j]) in seen.setdefault(key, set()):
                tokens[r, j] += vocab
            seen[key].add(int(tokens[r, j]))
    target = torch.randint(2 * vocab, (b, n), generator=torch.Generator().manual_seed(seed + 9))
    tree = DraftTree(tokens, parents, depths)
    lens, path = walk_tree(tree, target)
    kernel_lens, kernel_path = walk_tree(tree, target, use_kernel=True)  # Triton, interpreted on CPU
    for r in range(b):
        expected = walk_reference(tokens[r].tolist(), parents[r].tolist(), target[r].tolist())
        assert lens[r] == kernel_lens[r] == len(expected)
        assert path[r].tolist() == kernel_path[r].tolist() == expected + [-1] * (n - len(expected))


@pytest.mark.parametrize("override,message", [
    (["speculative.num_draft_tokens=1"], "speculative.num_draft_tokens must be in 2..21"),
    (["speculative.num_draft_tokens=22"], "speculative.num_draft_tokens must be in 2..21"),
    (["speculative.num_steps=0"], "speculative.num_steps must be >= 1"),
    (["speculative.tree_score_temperature=0"], "speculative.tree_score_temperature must be > 0"),
])
def test_tree_config_errors_name_the_field_and_range(override, message):
    with pytest.raises(ConfigError, match=message):
        build_engine(["adaptive=off", "speculative.topk=4", "speculative.num_steps=2", *override])


def test_a_configured_tree_with_adaptive_starts_there_only_when_the_first_tier_lists_it():
    from support import compose_config

    from eyas.engine.config import prepare

    tree = ["speculative.topk=4", "speculative.num_steps=2", "speculative.num_draft_tokens=8"]
    config, notices = prepare(compose_config(tree))  # the default, adaptive=auto, runs a configured tree as it is
    assert config["adaptive"]["policy"] == "off" and config["speculative"]["topk"] == 4 and notices == []
    config, notices = prepare(compose_config(["adaptive=throughput", *tree]))  # the shipped tiers list no tree
    assert notices == ["adaptive: the tree 2x4/8 is not a candidate of the first tier "
                                 "['0', '1', '2', '3', '4', '5', '6', '7', 'suffix:16']; starting at its middle candidate, 4"]
    assert [config["speculative"][key] for key in ("num_steps", "topk", "num_draft_tokens")] == [4, 1, 5]
    listed = "adaptive.tiers=[{batch_size:4,candidates:[1,3,{num_steps:2,topk:4,num_draft_tokens:8}]}]"
    config, notices = prepare(compose_config(["adaptive=throughput", *tree, listed]))
    assert notices == [] and config["speculative"]["topk"] == 4


def test_max_tree_nodes():
    assert max_tree_nodes(1, 5) == 6 and max_tree_nodes(4, 5) == 1 + 4 + 4 * 16 and max_tree_nodes(8, 1) == 9


def test_on_the_shipped_pair_a_tree_accepts_more_per_cycle_than_the_chain():
    """A wrong ancestor or parent state in the expansion still verifies losslessly but drafts worse:
    tau is the check. Greedy, so the figures are deterministic."""
    from eyas.engine.assets import asset_path

    prompts = [p for p in Path(asset_path("prompts")).read_text().splitlines() if p.strip()][:4]
    taus = {}
    for name, overrides in (("chain", engine_overrides(None, "eagle3", num_steps=5)),
                            ("tree", engine_overrides(None, "eagle3", num_steps=5, topk=4, nodes=16))):
        with build_engine(overrides) as eng:
            eng.generate(prompts, SamplingParams(max_new_tokens=48))
            taus[name] = eng.metrics()["mean_accept_length"]
    assert taus["tree"] > 1.12 * taus["chain"], taus


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_every_tree_node_is_among_the_top_children_of_its_parent_drafted_along_its_path(kind):
    """Each node's children come from the head run along that node's own path, as a chain would run
    it: replay every path with forced tokens and check the tree's children are its best ones (shipped
    pair: its head reads its context and its parent's state, so a wrong ancestor or state shows)."""
    from eyas.engine.forward_batch import ForwardBatch
    from eyas.engine.sampling import SamplingBatch

    topk = 3
    with build_engine(engine_overrides(None, kind, "speculative.tree_score_temperature=0.1", num_steps=5, topk=topk,
                                       nodes=40)) as eng:
        requests = eng.submit(["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def push(self, x):",
                               "for i in range(10):"], SamplingParams(max_new_tokens=40))
        for _ in range(3):
            eng.step()
        eng.scheduler.schedule()  # KV for the next step
        running = list(eng.scheduler.running)
        rows, lens = [r.row for r in running], [r.num_computed for r in running]
        bonus = torch.tensor([r.output_ids[-1] for r in running])
        head, state = eng.worker.drafter.head, eng.worker.state
        tree = head.tree(rows, lens, SamplingBatch.of_requests(running, torch.device("cpu")), bonus,
                         Candidate(state.candidate.num_steps, topk, 40), state.draft_decode_backend)
        checked = 0
        for b, (row, start) in enumerate(zip(rows, lens)):
            tokens, parents = tree.tokens[b].tolist(), tree.parents[b].tolist()
            for node in range(len(tokens)):
                kids = [tokens[j] for j in range(len(tokens)) if parents[j] == node]
                if not kids:
                    continue
                path = []
                i = node
                while i > 0:
                    path.append(tokens[i])
                    i = parents[i]
                hidden, logits = head.buffers.load(torch.tensor([row]))
                for depth, token in enumerate(reversed(path)):  # the chain's draft steps, tokens forced
                    batch = ForwardBatch.from_tails([row], [[token]], [start + depth], eng.worker.req_to_token)
                    out = head.runner.forward(batch, features=hidden)
                    hidden, logits = out.hidden, out.logits
                # siblings share their parent's score: the kept ones are its best len(kids) children
                best = set(head.model.draft_to_target(logits[0].topk(len(kids)).indices).tolist())
                assert set(kids) == best, (node, kids, best)
                checked += len(kids)
        eng.abort(requests)
    assert checked == 4 * 39 and int(tree.depths.max()) == 5
