"""Sampling: per-request seeds independent of the batch; frequencies match the filtered target distribution."""

import pytest
import torch
from support import build_engine
from support.engines import PLAIN
from support.references import chi_square_p_value, reference_probs

from eyas import SamplingParams
from eyas.testing.checkpoints import write_llama


def test_seeded_request_same_alone_and_in_batch(gqa_checkpoint):
    params = SamplingParams(max_new_tokens=16, temperature=0.9, top_p=0.9, seed=123, ignore_eos=True)
    with build_engine([*PLAIN, f"model.path={gqa_checkpoint}"]) as eng:
        alone = eng.generate(["def add(a, b):"], params)[0].token_ids
        others = [SamplingParams(max_new_tokens=n, temperature=1.0, seed=s, ignore_eos=True) for n, s in [(5, 1), (20, None)]]
        batch = eng.generate(
            ["import os", "def add(a, b):", "class Point:", "for i in range"],
            [others[0], params, others[1], SamplingParams(max_new_tokens=9, ignore_eos=True)],
        )
    assert batch[1].token_ids == alone
    assert len(set(alone)) > 4  # really sampled, not a constant


def test_different_seeds_differ(gqa_checkpoint):
    with build_engine([*PLAIN, f"model.path={gqa_checkpoint}"]) as eng:
        outs = eng.generate(["def add(a, b):"] * 2, [
            SamplingParams(max_new_tokens=16, temperature=1.0, seed=s, ignore_eos=True) for s in (1, 2)])
    assert outs[0].token_ids != outs[1].token_ids


@pytest.fixture(scope="module")
def tiny_vocab(tmp_path_factory):
    return write_llama(tmp_path_factory.mktemp("vocab16"), vocab_size=16, with_tokenizer=False, init_std=0.2, seed=11)


CASES = [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.0, 0, 0.8), (1.5, 6, 0.9)]
NUM_SAMPLES = 3000


@pytest.mark.parametrize("temperature,top_k,top_p", CASES)
def test_sampled_frequencies_match_distribution(tiny_vocab, temperature, top_k, top_p):
    from transformers import LlamaForCausalLM

    prompt = [0, 3, 9, 4, 12]
    with torch.no_grad():
        logits = LlamaForCausalLM.from_pretrained(tiny_vocab, dtype=torch.float32)(torch.tensor([prompt])).logits[0, -1]
    expected = reference_probs(logits, temperature, top_k, top_p)
    params = [SamplingParams(max_new_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p, seed=s, ignore_eos=True)
              for s in range(NUM_SAMPLES)]
    with build_engine([*PLAIN, f"model.path={tiny_vocab}", "cache.max_running_requests=512"]) as eng:
        outs = eng.generate(prompt_token_ids=[prompt] * NUM_SAMPLES, sampling=params)
    counts = torch.bincount(torch.tensor([o.token_ids[0] for o in outs]), minlength=16).double()
    assert int((expected > 0).sum()) >= 3, "degenerate fixture: the distribution must spread"
    assert counts[expected == 0].sum() == 0, "sampled a token the filters remove"
    assert chi_square_p_value(counts, expected) > 1e-3
    if top_k or top_p < 1:  # the test has power: the unfiltered distribution is rejected
        unfiltered = reference_probs(logits, temperature, 0, 1.0)
        assert chi_square_p_value(counts, unfiltered) < 1e-6


@pytest.mark.parametrize("scale", [0.3, 3.0, 12.0])  # flat rows reach past the candidates; peaked ones do not
def test_filters_on_candidates_and_on_every_column_give_the_reference_distribution(scale, monkeypatch):
    """Both ways `filtered_sorted` computes the filtered distribution (a sort of the best `CANDIDATES`
    columns, or every column bucketed without a sort) give temperature -> top-k -> top-p exactly, rows
    filtered differently in one batch."""
    from eyas.engine import sampling
    from eyas.engine.sampling import filtered_all_columns, filtered_sorted

    monkeypatch.setattr(sampling, "SMALL_VOCABULARY", 0)  # 300 columns: as a large vocabulary's

    gen = torch.Generator().manual_seed(int(scale * 10))
    settings = [(1.0, 0, 0.9), (0.7, 0, 0.5), (1.3, 40, 1.0), (0.8, 100, 0.95), (0.6, 3, 0.99), (1.0, 0, 1.0)]
    logits = torch.randn(len(settings), 300, generator=gen) * scale
    temperature, top_k, top_p = (torch.tensor(col) for col in zip(*settings))
    expected = torch.stack([reference_probs(row, *s) for row, s in zip(logits, settings)]).float()
    filtered = slice(0, len(settings) - 1)  # without the unfiltered row, which takes every column
    probs, columns = filtered_sorted(logits[filtered], temperature[filtered], top_k[filtered], top_p[filtered])
    assert columns is not None or scale < 10  # peaked rows: every nucleus among the candidates
    dense = probs if columns is None else torch.zeros_like(logits[filtered]).scatter_(1, columns, probs)
    everywhere = filtered_all_columns(logits / temperature[:, None], top_k, top_p)
    for got, want in ((dense, expected[filtered]), (everywhere, expected)):
        clear = (got > 1e-12) | (want > 1e-12)  # float32 tails round where float64 ones do not
        assert torch.equal((got > 0)[clear], (want > 0)[clear])
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_top_k_keeps_exactly_k_at_ties_and_any_k_past_the_vocabulary():
    """Tied logits at the k-th value (common with bf16 projections): both filter paths keep k columns
    by rank, as the reference does; a top_k past the vocabulary filters nothing."""
    from eyas.engine.sampling import filtered_all_columns, filtered_sorted

    logits = torch.tensor([[5.0, 4.0, 4.0, 4.0, 1.0, 0.0], [1.0, 2.0, 3.0, 3.0, 3.0, 0.0]])
    top_k, top_p = torch.tensor([2, 3]), torch.ones(2)
    for got in (filtered_all_columns(logits, top_k, top_p), filtered_sorted(logits, torch.ones(2), top_k, top_p)[0]):
        assert ((got > 0).sum(dim=1) == top_k).all()
    wide = filtered_all_columns(logits, torch.tensor([500, 6]), top_p)
    torch.testing.assert_close(wide, logits.softmax(dim=-1))


def test_uniforms_stay_below_one():
    """The top hash value would round to 1 in float32 (E = -log u = 0: a column of probability 0 would
    win the race as 0 / 0); it is kept below 1."""
    from eyas.engine import keyed_random

    top = keyed_random.to_uniforms(torch.tensor([2**32 - 1, 0]))
    assert top[0] < 1.0 and top[1] > 0.0
    assert torch.isfinite(keyed_random.exponentials(torch.zeros(1, 2, dtype=torch.int64), torch.arange(4096))).all()
