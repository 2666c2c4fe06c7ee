"""Speculative sampling is lossless: emitted tokens follow the target's (filtered) distribution at every
temperature and filter, with greedy or sampled drafts."""

import itertools

import pytest
import torch
from support import build_engine
from support.engines import engine_overrides
from support.references import chi_square_p_value, reference_probs, reference_processed

from eyas import SamplingParams
from eyas.testing.checkpoints import write_eagle3_head, write_eagle_head, write_llama

PROMPT = [0, 3, 9, 4, 12]
NUM_SAMPLES = 3000
VOCAB = 16


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    target = write_llama(tmp_path_factory.mktemp("t16"), vocab_size=VOCAB, with_tokenizer=False, init_std=0.2,
                         residual_scale=0.05, num_layers=2, seed=11)
    head = write_eagle_head(tmp_path_factory.mktemp("e16"), target, token_only=True)
    return target, head


def exact_marginals(target, temperature, top_k, top_p, processing: SamplingParams | None = None):
    """P(x1), P(x2), P(x3) of the target under the filters (and the logit bias, penalties and min_p of
    `processing`), and their joint [x1, x2, x3], by enumerating continuations."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(target, dtype=torch.float32)

    def next_probs(prefixes):
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT + list(p) for p in prefixes])).logits[:, -1].double()
        if processing is None:
            return [reference_probs(lg, temperature, top_k, top_p) for lg in logits]
        return [reference_probs(reference_processed(lg, processing, PROMPT, list(p)), temperature, top_k, top_p,
                                processing.min_p) for lg, p in zip(logits, prefixes)]

    p1 = next_probs([()])[0]
    p2 = torch.stack(next_probs([(a,) for a in range(VOCAB)]))  # [x1, x2]
    p3 = torch.stack(next_probs(list(itertools.product(range(VOCAB), repeat=2)))).view(VOCAB, VOCAB, VOCAB)
    joint = p1[:, None, None] * p2[:, :, None] * p3  # [x1, x2, x3]
    return [joint.sum((1, 2)), joint.sum((0, 2)), joint.sum((0, 1))], joint


def repeat_pattern(x1, x2, x3):
    """Which of x1 .. x3 repeat an earlier one, as 0..7: what penalties change most."""
    return 4 * (x2 == x1) + 2 * (x3 == x1) + (x3 == x2)


# temperature, top_k, top_p: verification must apply each filter as plain decoding does
CASES = [(1.0, 0, 1.0), (1.0, 0, 0.8), (0.7, 5, 1.0), (1.5, 6, 0.9)]


# chain (topk 1) and EAGLE-2 trees: topk children per expanded node, `nodes` kept (root counted). By
# default the chain runs unfiltered and fully filtered, the widest tree fully filtered; -m slow runs the rest
SHAPES = {"chain": (1, 3), "tree2": (2, 6), "tree4": (4, 12)}
DEFAULT_RUNS = {("chain", CASES[0]), ("chain", CASES[-1]), ("tree4", CASES[-1])}
RUNS = [pytest.param(*case, *shape, id=f"{'-'.join(map(str, case))}-{name}",
                     marks=[] if (name, case) in DEFAULT_RUNS else [pytest.mark.slow])
        for name, shape in SHAPES.items() for case in CASES]


@pytest.mark.parametrize("verify", ["reproducible", "rejection"])
@pytest.mark.parametrize("draft_sampling", ["greedy", "sample"])
@pytest.mark.parametrize("temperature,top_k,top_p,topk,nodes", RUNS)
def test_speculative_sampling_matches_target_distribution(tiny_pair, verify, draft_sampling, temperature, top_k,
                                                          top_p, topk, nodes):
    check_distribution(tiny_pair, verify, draft_sampling, temperature, top_k, top_p, topk, nodes)


@pytest.mark.parametrize("temperature,top_k,top_p", [CASES[0], CASES[-1]])
def test_rejection_with_a_reduced_draft_vocabulary_matches_target_distribution(tiny_pair, tmp_path, temperature,
                                                                              top_k, top_p):
    """An EAGLE-3 head drafting over 10 of the 16 tokens: q is zero on the other 6 (mapped by d2t), and
    the residual max(0, p - q) still gives them their probability."""
    target, _ = tiny_pair
    head = write_eagle3_head(tmp_path / "e3", target, draft_vocab_size=10, seed=4, aux_layer_ids=(0, 1, 1))
    # an untrained head: few drafts accepted (about 2%, a hundred and more of 6000), most rejected
    check_distribution((target, head), "rejection", "sample", temperature, top_k, top_p, 1, 3, kind="eagle3",
                       min_accept_rate=0.01)


# logit bias, penalties and min_p, the drafts before a position in a verify counted as plain decoding counts them
PROCESSING = dict(logit_bias={3: 1.5, 5: -2.0}, presence_penalty=2.0, frequency_penalty=1.0, repetition_penalty=2.0,
                  min_p=0.02)


@pytest.mark.parametrize("verify", ["reproducible", "rejection"])
@pytest.mark.parametrize("topk,nodes", [SHAPES["chain"], SHAPES["tree2"]], ids=["chain", "tree2"])
def test_penalties_bias_and_min_p_keep_the_target_distribution(tiny_pair, verify, topk, nodes):
    check_distribution(tiny_pair, verify, "sample", 1.0, 0, 1.0, topk, nodes, processing=PROCESSING)


def check_distribution(tiny_pair, verify, draft_sampling, temperature, top_k, top_p, topk, nodes, kind="eagle",
                       min_accept_rate=0.05, processing: dict | None = None):
    target, head = tiny_pair
    extra = processing or {}
    expected, joint = exact_marginals(target, temperature, top_k, top_p, SamplingParams(**extra) if processing else None)
    params = [SamplingParams(max_new_tokens=3, temperature=temperature, top_k=top_k, top_p=top_p, seed=s,
                             ignore_eos=True, **extra) for s in range(NUM_SAMPLES)]
    overrides = engine_overrides(target, kind, f"speculative.draft_sampling={draft_sampling}",
                                 f"speculative.verify={verify}",
                                 "cache.max_running_requests=512", head=head, num_steps=2, topk=topk, nodes=nodes)
    with build_engine(overrides) as eng:
        outs = eng.generate(prompt_token_ids=[PROMPT] * NUM_SAMPLES, sampling=params)
        metrics = eng.metrics()
    assert min_accept_rate < metrics["draft_accept_rate"] < 0.95  # both acceptance and rejection are exercised
    tokens = torch.tensor([o.token_ids for o in outs])  # [N, 3]
    for position in range(3):
        counts = torch.bincount(tokens[:, position], minlength=VOCAB).double()
        assert int((expected[position] > 0).sum()) >= 3
        assert counts[expected[position] == 0].sum() == 0
        assert chi_square_p_value(counts, expected[position]) > 1e-3, f"token {position + 1}"
    if processing or (temperature, top_k, top_p) != (1.0, 0, 1.0):  # power: the unfiltered T = 1 distribution is rejected
        unfiltered = exact_marginals(target, 1.0, 0, 1.0)[0]
        counts = torch.bincount(tokens[:, 1], minlength=VOCAB).double()
        assert chi_square_p_value(counts, unfiltered[1]) < 1e-6
    if processing:  # a position's penalties count the tokens before it, drafts of the same verify included
        ids = torch.arange(VOCAB)
        patterns = repeat_pattern(ids[:, None, None], ids[None, :, None], ids[None, None, :])
        expected_patterns = torch.zeros(8, dtype=torch.float64).scatter_add_(0, patterns.flatten(), joint.flatten())
        counts = torch.bincount(repeat_pattern(tokens[:, 0], tokens[:, 1], tokens[:, 2]), minlength=8).double()
        assert chi_square_p_value(counts, expected_patterns) > 1e-3
