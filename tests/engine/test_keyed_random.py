"""The counter-based noise and the keyed sampler: exact integer arithmetic, uniform and independent
draws, and samples that follow the filtered distribution."""

import random

import pytest
import torch
from support.references import chi_square_p_value, reference_probs

from eyas.engine import keyed_random
from eyas.engine.sampling import Sampler, SamplingBatch, filtered_sorted
from eyas.engine.sampling_params import SamplingParams


def mix32_reference(x: int) -> int:
    """The mixer in plain Python integers."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_mixer_equals_unbounded_integer_arithmetic():
    rng = random.Random(0)
    values = [0, 1, 2**31 - 1, 2**31, 2**32 - 1] + [rng.randrange(2**32) for _ in range(2000)]
    got = keyed_random._mix32(torch.tensor(values, dtype=torch.int64)).tolist()
    assert got == [mix32_reference(v) for v in values]
    assert keyed_random._mix32_(torch.tensor(values, dtype=torch.int64)).tolist() == got  # the in-place one


def test_uniforms_leave_their_inputs_alone():
    keys = torch.tensor([[5, 2**32 - 1], [2**31, 7]], dtype=torch.int64)
    token_ids = torch.arange(1000)
    first = keyed_random.uniforms(keys, token_ids)
    assert torch.equal(token_ids, torch.arange(1000)) and keys.tolist() == [[5, 2**32 - 1], [2**31, 7]]
    assert torch.equal(keyed_random.uniforms(keys, token_ids), first)


def test_seed_words_cover_the_whole_seed_range():
    words = {keyed_random.seed_words(s) for s in [*range(1000), 2**32, 2**63, 2**64 - 1]}
    assert len(words) == 1003
    assert all(0 <= w < 2**32 for pair in words for w in pair)


def test_recorded_stream_never_changes():
    """The noise is part of what a seed means: a change here would change every seeded output."""
    words = [keyed_random.seed_words(s) for s in (0, 12345, 2**64 - 1)]
    assert words[0] == (2065550767, 3793791033) and words[2] == (459615264, 3839455607)
    keys = keyed_random.row_keys(torch.tensor(words), torch.tensor([0, 7, 100000]))
    assert keys.tolist() == [[2351335141, 4204088601], [2853939862, 2268413897], [762162407, 1992045553]]
    u = keyed_random.uniforms(keys, torch.tensor([0, 1, 4095]))
    assert ((u * 2**24) - 0.5).long().tolist() == [[3015391, 10561408, 7312419], [225123, 14676510, 15109316],
                                                   [15514260, 953866, 10755988]]


def keys(seeds, positions):
    words = torch.tensor([keyed_random.seed_words(s) for s in seeds])
    return keyed_random.row_keys(words, torch.tensor(positions))


def uniform_p_value(u: torch.Tensor, bins: int = 64) -> float:
    counts = torch.bincount((u * bins).long().flatten(), minlength=bins).double()
    return chi_square_p_value(counts, torch.full((bins,), 1.0 / bins, dtype=torch.float64))


def test_uniforms_are_uniform_along_tokens_positions_and_seeds():
    tokens = torch.arange(4096)
    u = keyed_random.uniforms(keys([7] * 64, list(range(64))), tokens)  # [positions, tokens]
    assert 0.0 < float(u.min()) and float(u.max()) < 1.0
    assert uniform_p_value(u) > 1e-3
    one_token = keyed_random.uniforms(keys([7] * 4096, list(range(4096))), torch.tensor([5]))
    assert uniform_p_value(one_token, bins=16) > 1e-3
    across_seeds = keyed_random.uniforms(keys(list(range(4096)), [3] * 4096), torch.tensor([5]))
    assert uniform_p_value(across_seeds, bins=16) > 1e-3


@pytest.mark.parametrize("pair", ["next_position", "next_seed", "next_token"])
def test_neighbouring_draws_are_independent(pair):
    """Contingency chi-square on 8 x 8 bins of two draws that differ only in one key component."""
    n = 8192
    if pair == "next_position":
        a = keyed_random.uniforms(keys([11] * n, list(range(0, 2 * n, 2))), torch.tensor([9]))
        b = keyed_random.uniforms(keys([11] * n, list(range(1, 2 * n, 2))), torch.tensor([9]))
    elif pair == "next_seed":
        a = keyed_random.uniforms(keys(list(range(0, 2 * n, 2)), [4] * n), torch.tensor([9]))
        b = keyed_random.uniforms(keys(list(range(1, 2 * n, 2)), [4] * n), torch.tensor([9]))
    else:
        u = keyed_random.uniforms(keys([11] * n, list(range(n))), torch.tensor([9, 10]))
        a, b = u[:, :1], u[:, 1:]
    cells = (a * 8).long().flatten() * 8 + (b * 8).long().flatten()
    counts = torch.bincount(cells, minlength=64).double()
    assert chi_square_p_value(counts, torch.full((64,), 1 / 64, dtype=torch.float64)) > 1e-3
    assert abs(float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])) < 0.05


CASES = [(1.0, 0, 1.0), (0.6, 0, 1.0), (1.0, 4, 1.0), (1.0, 0, 0.7), (1.4, 6, 0.9)]


@pytest.mark.parametrize("temperature,top_k,top_p", CASES)
def test_keyed_sampler_draws_the_filtered_distribution(temperature, top_k, top_p):
    logits = torch.randn(12, generator=torch.Generator().manual_seed(3)) * 1.5
    n = 6000
    params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)] * n
    batch = SamplingBatch.of(params, [keyed_random.seed_words(s) for s in range(n)], [0] * n, "cpu")
    tokens = Sampler().sample(logits.expand(n, -1), batch)[:, 0]
    expected = reference_probs(logits, temperature, top_k, top_p)
    counts = torch.bincount(tokens, minlength=12).double()
    assert counts[expected == 0].sum() == 0
    assert chi_square_p_value(counts, expected) > 1e-3


def test_rows_of_one_request_follow_its_positions():
    """Verify rows [B * width] score positions p .. p + width - 1: the same tokens as one row per position."""
    logits = torch.randn(2 * 4, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=0.8, top_k=10, seed=2)]
    words = [keyed_random.seed_words(p.seed) for p in params]
    wide = Sampler().sample(logits, SamplingBatch.of(params, words, [5, 9], "cpu"), width=4)
    for b in range(2):
        for j in range(4):
            one = SamplingBatch.of([params[b]], [words[b]], [[5, 9][b] + j], "cpu")
            assert int(Sampler().sample(logits[b * 4 + j:b * 4 + j + 1], one)[0, 0]) == int(wide[b, j])


def test_draft_columns_use_the_noise_of_their_token_ids():
    """A draft vocabulary (columns named by target ids) draws, for a distribution it fully supports, the
    same token as the full vocabulary: coupled drafts propose the target's own sample."""
    vocab, draft_ids = 64, torch.tensor([3, 8, 20, 21, 40, 63])
    full = torch.full((1, vocab), float("-inf"))
    full[0, draft_ids] = torch.randn(len(draft_ids), generator=torch.Generator().manual_seed(1))
    for seed in range(200):
        batch = SamplingBatch.of([SamplingParams(temperature=1.0)], [keyed_random.seed_words(seed)], [4], "cpu")
        on_full = int(Sampler().sample(full, batch)[0, 0])
        on_draft = int(draft_ids[Sampler().sample(full[:, draft_ids], batch, token_ids=draft_ids)[0, 0]])
        assert on_full == on_draft


def test_greedy_rows_take_the_argmax_beside_sampled_rows():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(2))
    params = [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams()]
    batch = SamplingBatch.of(params, [keyed_random.seed_words(i) for i in range(3)], [0, 0, 0], "cpu")
    tokens = Sampler().sample(logits, batch)[:, 0]
    assert tokens[0] == logits[0].argmax() and tokens[2] == logits[2].argmax()


def test_top_k_of_one_is_the_argmax_at_any_temperature():
    logits = torch.randn(64, 30, generator=torch.Generator().manual_seed(4))
    params = [SamplingParams(temperature=2.0, top_k=1, seed=i) for i in range(64)]
    batch = SamplingBatch.of(params, [keyed_random.seed_words(i) for i in range(64)], list(range(64)), "cpu")
    assert torch.equal(Sampler().sample(logits, batch)[:, 0], logits.argmax(dim=-1))


def test_only_filtered_rows_are_ranked(monkeypatch):
    """Without top-k or top-p nothing is sorted; with top-k (in a large vocabulary) only the k best
    columns are ranked."""
    from eyas.engine import sampling

    monkeypatch.setattr(sampling, "SMALL_VOCABULARY", 0)  # 500 columns: as a large vocabulary's
    logits = torch.randn(3, 500, generator=torch.Generator().manual_seed(5))
    t, off_k, off_p = torch.ones(3), torch.zeros(3, dtype=torch.int64), torch.ones(3)
    probs, columns = filtered_sorted(logits, t, off_k, off_p)
    assert columns is None and probs.shape == (3, 500)
    probs, columns = filtered_sorted(logits, t, torch.tensor([5, 7, 3]), off_p)
    assert columns.shape == (3, 7) and torch.equal(columns[0, :5], logits[0].topk(5).indices)
    assert (probs[0, 5:] == 0).all() and (probs[2, 3:] == 0).all()


def test_top_p_covered_by_the_first_token_keeps_only_it():
    logits = torch.zeros(12)
    logits[4] = 3.0  # p = e^3 / (e^3 + 11) = 0.646
    n = 300
    params = [SamplingParams(temperature=1.0, top_p=0.6)] * n
    batch = SamplingBatch.of(params, [keyed_random.seed_words(s) for s in range(n)], [0] * n, "cpu")
    assert (Sampler().sample(logits.expand(n, -1), batch)[:, 0] == 4).all()


def test_host_hash_gives_the_tensor_hash_bits():
    """A step's few keys and stream uniforms are hashed on the host: bit for bit the tensor hash's."""
    from eyas.engine.sampling import STREAMS

    rng = random.Random(3)
    words = [keyed_random.seed_words(rng.randrange(2**64)) for _ in range(20)]
    positions = [rng.randrange(2**31) for _ in range(20)]
    keys = keyed_random.row_keys(torch.tensor(words), torch.tensor(positions))
    assert keys.tolist() == [list(keyed_random.row_keys_host(w, p)) for w, p in zip(words, positions)]
    ids = torch.tensor([0, 1, 4095, 2**31 - 1, *STREAMS])
    bits = torch.tensor([[keyed_random.hash_host(tuple(k), i) for i in ids.tolist()] for k in keys.tolist()])
    assert torch.equal(keyed_random.to_uniforms(bits), keyed_random.uniforms(keys, ids))
    # a batch's window: hashed on the host (few positions) or as tensors (many), the same values
    params = [SamplingParams(temperature=1.0)] * 20
    small = SamplingBatch.of(params, words, positions, "cpu", horizon=3)
    large = SamplingBatch.of(params, words, positions, "cpu", horizon=3)
    small._window(3)
    large._window(100)  # 20 x 100 positions: past the host limit
    assert torch.equal(small.keys(3), large.keys(3))
    for stream in STREAMS:
        assert torch.equal(small.uniforms(stream, 2, 1), large.uniforms(stream, 2, 1))
