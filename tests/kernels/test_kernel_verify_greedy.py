"""Greedy tree verification kernel against a python tree walk (random trees) and the torch chain
formula; integer outputs, compared exactly."""

import random

import pytest
import torch
from support.kernel_device import on_device

from eyas.kernels import verify_greedy as verify_module
from eyas.kernels.verify_greedy import chain_layout

verify_greedy = on_device(verify_module.verify_greedy)


def tree_layout(parents):
    """First-child / next-sibling lists of a tree given by `parents` (parents[0] = -1, parents[i] < i)."""
    num_nodes = len(parents)
    next_token, next_sibling = [-1] * num_nodes, [-1] * num_nodes
    last_child = [-1] * num_nodes
    for node in range(1, num_nodes):
        parent = parents[node]
        if last_child[parent] < 0:
            next_token[parent] = node
        else:
            next_sibling[last_child[parent]] = node
        last_child[parent] = node
    return next_token, next_sibling


def walk(candidates, next_token, next_sibling, target_predict):
    """Python reference for one request: (accept_len, path nodes, emitted tokens)."""
    path = [0]
    node = 0
    while True:
        child = next_token[node]
        while child != -1 and candidates[child] != target_predict[node]:
            child = next_sibling[child]
        if child == -1:
            break
        path.append(child)
        node = child
    return len(path), path, [target_predict[n] for n in path]


def random_trees(batch, num_nodes, vocab, seed):
    """Random trees whose target often agrees with one child, so that walks go deep."""
    rng = random.Random(seed)
    rows = {"candidates": [], "next_token": [], "next_sibling": [], "target_predict": []}
    for _ in range(batch):
        parents = [-1] + [rng.randrange(node) for node in range(1, num_nodes)]
        next_token, next_sibling = tree_layout(parents)
        candidates = [rng.randrange(vocab) for _ in range(num_nodes)]
        target_predict = []
        for node in range(num_nodes):
            children = [c for c in range(node + 1, num_nodes) if parents[c] == node]
            agree = children and rng.random() < 0.8
            target_predict.append(candidates[rng.choice(children)] if agree else rng.randrange(vocab))
        for name, values in zip(rows, (candidates, next_token, next_sibling, target_predict)):
            rows[name].append(values)
    return {name: torch.tensor(values, dtype=torch.int64) for name, values in rows.items()}


def outputs(batch, num_nodes):
    return (torch.full((batch,), -7, dtype=torch.int32), torch.full((batch, num_nodes), -7, dtype=torch.int32),
            torch.full((batch, num_nodes), -7, dtype=torch.int64))


def check_against_walk(tree):
    batch, num_nodes = tree["candidates"].shape
    accept_lens, accept_index, emitted = verify_greedy(**tree, **dict(zip(
        ("accept_lens", "accept_index", "emitted"), outputs(batch, num_nodes))))
    for b in range(batch):
        length, path, tokens = walk(*(tree[name][b].tolist() for name in
                                      ("candidates", "next_token", "next_sibling", "target_predict")))
        pad = [-1] * (num_nodes - length)
        assert accept_lens[b].item() == length
        assert accept_index[b].tolist() == path + pad
        assert emitted[b].tolist() == tokens + pad


@pytest.mark.parametrize("batch,num_nodes,vocab,seed", [(8, 8, 3, 0), (5, 13, 2, 1), (3, 1, 4, 2), (4, 2, 2, 3)])
def test_random_trees_match_walk(batch, num_nodes, vocab, seed):
    check_against_walk(random_trees(batch, num_nodes, vocab, seed))


@pytest.mark.slow
@pytest.mark.parametrize("num_nodes", [3, 16, 33, 64])
@pytest.mark.parametrize("vocab", [2, 5])
def test_random_trees_sweep(num_nodes, vocab):
    check_against_walk(random_trees(16, num_nodes, vocab, seed=num_nodes * vocab))


@pytest.mark.parametrize("batch,num_drafts,vocab", [(9, 4, 2), (4, 7, 3), (2, 0, 2)])
def test_chain_matches_torch_formula(batch, num_drafts, vocab):
    gen = torch.Generator().manual_seed(num_drafts)
    drafts = torch.randint(vocab, (batch, num_drafts), generator=gen)
    target = torch.randint(vocab, (batch, num_drafts + 1), generator=gen)
    target[0, :num_drafts] = drafts[0]  # one request accepts every draft
    candidates = torch.cat([torch.randint(vocab, (batch, 1), generator=gen), drafts], dim=1)
    next_token, next_sibling = chain_layout(batch, num_drafts, "cpu")
    accept_lens, accept_index, emitted = outputs(batch, num_drafts + 1)
    verify_greedy(candidates, next_token, next_sibling, target, accept_lens, accept_index, emitted)

    matches = (drafts == target[:, :-1]).int().cumprod(1).sum(1)
    expected_lens = matches + 1
    assert accept_lens.tolist() == expected_lens.tolist()
    assert accept_lens[0].item() == num_drafts + 1
    for b, length in enumerate(expected_lens.tolist()):
        pad = [-1] * (num_drafts + 1 - length)
        assert emitted[b].tolist() == target[b, :length].tolist() + pad
        assert accept_index[b].tolist() == list(range(length)) + pad


def test_chain_layout():
    next_token, next_sibling = chain_layout(2, 3, "cpu")
    assert next_token.tolist() == [[1, 2, 3, -1]] * 2
    assert next_sibling.tolist() == [[-1] * 4] * 2
    assert next_token.dtype == next_sibling.dtype == torch.int64


def valid_args():
    next_token, next_sibling = chain_layout(2, 3, "cpu")
    accept_lens, accept_index, emitted = outputs(2, 4)
    return dict(candidates=torch.zeros(2, 4, dtype=torch.int64), next_token=next_token, next_sibling=next_sibling,
                target_predict=torch.zeros(2, 4, dtype=torch.int64), accept_lens=accept_lens,
                accept_index=accept_index, emitted=emitted)


def bad(**overrides):
    return overrides


@pytest.mark.parametrize("overrides,match", [
    (bad(candidates=torch.zeros(2, 0, dtype=torch.int64)), "candidates must be"),
    (bad(next_token=torch.zeros(2, 5, dtype=torch.int64)), "next_token must be"),
    (bad(target_predict=torch.zeros(2, 4, dtype=torch.int32)), "target_predict must be int64"),
    (bad(next_sibling=torch.zeros(4, 2, dtype=torch.int64).t()), "next_sibling must be contiguous"),
    (bad(accept_lens=torch.zeros(2, dtype=torch.int64)), "accept_lens must be int32"),
    (bad(accept_lens=torch.zeros(3, dtype=torch.int32)), "accept_lens must be"),
    (bad(accept_index=torch.zeros(2, 4, dtype=torch.int64)), "accept_index must be torch.int32"),
    (bad(emitted=torch.zeros(2, 3, dtype=torch.int64)), "emitted must be"),
])
def test_rejects_bad_arguments(overrides, match):
    with pytest.raises(ValueError, match=match):
        verify_greedy(**{**valid_args(), **overrides})
