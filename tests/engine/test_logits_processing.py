"""Logit bias, penalties, min_p, logprobs, n and stop token ids: each the same as plain decoding under
every drafter, plain decoding the same as transformers where it has the feature, and errors naming the field."""

import math
import random
from types import SimpleNamespace

import pytest
import torch
from support import build_engine
from support.engines import PROMPTS, engine_overrides, run_plain
from support.oracle import hf_model
from support.references import reference_processed

from eyas import ConfigError, SamplingParams
from eyas.engine.logits_processing import LogitsProcessing
from eyas.engine.speculative.tree import ancestor_mask

PROCESSED = dict(presence_penalty=0.6, frequency_penalty=0.4, repetition_penalty=1.3)
# drafters and shapes: an EAGLE chain, an EAGLE-3 tree, n-gram lookup, the hybrid's tree
DRAFTERS = {"eagle-chain": ("eagle", 1), "eagle3-tree": ("eagle3", 3), "ngram": ("ngram", 1), "hybrid-tree": ("hybrid", 2)}


def test_each_node_of_a_tree_counts_the_drafts_on_its_path():
    """Node j's logits score the position after the output and the drafts from the root to j."""
    rng = random.Random(0)
    vocab, n = 12, 6
    parents = torch.tensor([[-1, 0, 0, 1, 3, 2], [-1, 0, 1, 2, 3, 4]])  # a tree; a chain
    tokens = torch.tensor([[5, 3, 3, 7, 3, -1], [2, 2, 9, 2, 4, 4]])  # repeats along paths, an unfilled node
    requests = [SimpleNamespace(params=SamplingParams(logit_bias={1: 2.5, 4: -3.0}, **PROCESSED),
                                prompt_ids=[rng.randrange(vocab) for _ in range(5)],
                                output_ids=[rng.randrange(vocab) for _ in range(4)] + [int(tokens[b, 0])])
                for b in range(2)]
    requests.insert(1, SimpleNamespace(params=SamplingParams(), prompt_ids=[1], output_ids=[2]))  # untouched
    logits = torch.randn(3 * n, vocab)
    tree_tokens = torch.cat([tokens[:1], torch.zeros(1, n, dtype=torch.int64), tokens[1:]])
    tree_parents = torch.cat([parents[:1], parents[1:], parents[1:]])
    processing = LogitsProcessing.of_requests(requests)
    got = processing.apply(logits, tree_tokens, ancestor_mask(tree_parents)).view(3, n, vocab)
    chain = processing.apply(logits, tree_tokens).view(3, n, vocab)  # a chain: node j's path is 0..j
    assert torch.equal(got[1], logits.view(3, n, vocab)[1])
    for b, request in ((0, requests[0]), (2, requests[2])):
        for j in range(n):
            path, node = [], j
            while node > 0:
                path.insert(0, int(tree_tokens[b, node]))
                node = int(tree_parents[b, node])
            drafts = [t for t in path if t >= 0]
            expected = reference_processed(logits.view(3, n, vocab)[b, j], request.params, request.prompt_ids,
                                           request.output_ids + drafts)
            assert torch.allclose(got[b, j].double(), expected, atol=1e-5), (b, j)
        if b == 2:  # the chain row's parents are a chain: both paths agree
            assert torch.allclose(chain[b], got[b], atol=1e-6)


def test_repetition_penalty_equals_transformers(checkpoint):
    """transformers' repetition penalty (over the prompt and the output) against plain decoding's."""

    path = checkpoint("gqa")
    model = hf_model(path)
    params = SamplingParams(max_new_tokens=24, repetition_penalty=1.8, ignore_eos=True)
    outs = run_plain(path, PROMPTS[:3], params)
    free = run_plain(path, PROMPTS[:3], SamplingParams(max_new_tokens=24, ignore_eos=True))
    assert any(o.token_ids != f.token_ids for o, f in zip(outs, free)), "the penalty changed nothing"
    for out in outs:
        ids = torch.tensor([out.prompt_token_ids])
        hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                            repetition_penalty=1.8, pad_token_id=0)
        assert out.token_ids == hf[0, ids.shape[1]:].tolist()


def biased_params(spec_pair, penalties=PROCESSED, max_new_tokens=24, **extra) -> SamplingParams:
    """Penalties, and a bias against the token plain greedy decoding emits most (so the bias shows)."""
    target, _ = spec_pair
    free = run_plain(target, PROMPTS, SamplingParams(max_new_tokens=24, ignore_eos=True))
    common = max(range(320), key=lambda t: sum(o.token_ids.count(t) for o in free))
    return SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True, logit_bias={common: -100.0, 7: 3.0},
                          **penalties, **extra)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_with_penalties_and_bias_equals_plain_for_every_drafter(spec_pair, drafter):
    """Long enough, and with drafts accepted often enough, that a penalty not counting the drafts
    before a position in the same verify changes the output (checked for each drafter)."""
    target, heads = spec_pair
    algorithm, topk = DRAFTERS[drafter]
    prompts, params = PROMPTS, biased_params(spec_pair, max_new_tokens=48)
    if algorithm == "ngram":  # prompts holding the model's own continuation, so lookups draft it, and a
        # mild penalty alone (strong ones, or the bias, turn the repeats down)
        free = run_plain(target, PROMPTS, SamplingParams(max_new_tokens=40, ignore_eos=True))
        prompts = [o.prompt_token_ids + o.token_ids for o in free]
        params = SamplingParams(max_new_tokens=48, ignore_eos=True, frequency_penalty=0.1)
    plain = [o.token_ids for o in run_plain(target, prompts, params)]
    free = [o.token_ids for o in run_plain(target, prompts, SamplingParams(max_new_tokens=48, ignore_eos=True))]
    assert plain != free
    assert not any(t in ids for ids in plain for t, b in params.logit_bias.items() if b < 0)
    head = heads.get("eagle3" if algorithm == "hybrid" else algorithm)
    with build_engine(engine_overrides(target, algorithm, head=head, num_steps=5 if topk == 1 else 3, topk=topk)) as eng:
        outs = eng.generate(prompt_token_ids=[list(p) for p in prompts] if algorithm == "ngram" else None,
                            prompts=None if algorithm == "ngram" else prompts, sampling=params)
        assert eng.metrics()["mean_accept_length"] > 1.5  # drafts accepted
    assert [o.token_ids for o in outs] == plain


@pytest.mark.parametrize("drafter", ["eagle-chain", "eagle3-tree"])
def test_seeded_sampling_with_penalties_bias_and_min_p_equals_plain(spec_pair, drafter):
    """Under speculative.verify=reproducible a seeded request emits plain decoding's tokens."""
    target, heads = spec_pair
    algorithm, topk = DRAFTERS[drafter]
    params = [biased_params(spec_pair, temperature=0.9, top_p=0.95, min_p=0.05, seed=s) for s in range(len(PROMPTS))]
    plain = [o.token_ids for o in run_plain(target, PROMPTS, params)]
    with build_engine(engine_overrides(target, algorithm, head=heads[algorithm], num_steps=3, topk=topk)) as eng:
        assert [o.token_ids for o in eng.generate(PROMPTS, params)] == plain


def test_logprobs_equal_transformers_and_are_the_same_under_speculation(spec_pair):
    """Each token's logprob and its 3 best alternatives: log_softmax of the processed logits / T at its
    position (transformers' logits, processed by the reference), and bit for bit the same with a
    speculative engine (a tree verify), for greedy and seeded sampled requests: a forward that carries a
    logprobs request computes each position as a one-token decode would (`ForwardBatch.exact`)."""

    target, heads = spec_pair
    params = [SamplingParams(max_new_tokens=16, ignore_eos=True, logprobs=3, **PROCESSED),
              SamplingParams(max_new_tokens=16, ignore_eos=True, logprobs=3, temperature=0.7, seed=5, logit_bias={9: 2.0}),
              SamplingParams(max_new_tokens=16, ignore_eos=True, logprobs=0)]
    prompts = PROMPTS[:3]
    plain = run_plain(target, prompts, params)
    model = hf_model(target)
    for out, p in zip(plain, params):
        assert [e.token_id for e in out.logprobs] == out.token_ids and all(len(e.top) == p.logprobs for e in out.logprobs)
        ids = out.prompt_token_ids + out.token_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, len(out.prompt_token_ids) - 1:-1]
        for i, entry in enumerate(out.logprobs):
            processed = reference_processed(logits[i], p, out.prompt_token_ids, out.token_ids[:i])
            expected = (processed / (p.temperature or 1.0)).log_softmax(dim=-1)
            assert math.isclose(entry.logprob, float(expected[entry.token_id]), abs_tol=1e-4)
            best = expected.topk(p.logprobs) if p.logprobs else None
            if best is not None:
                assert [t for t, _ in entry.top] == best.indices.tolist()
                assert torch.allclose(torch.tensor([lp for _, lp in entry.top]).double(), best.values, atol=1e-4)
    with build_engine(engine_overrides(target, "eagle3", head=heads["eagle3"], num_steps=3, topk=3)) as eng:
        spec = eng.generate(prompts, params)
        assert eng.metrics()["mean_accept_length"] > 1.2
    for s, o in zip(spec, plain):
        assert s.token_ids == o.token_ids and s.logprobs == o.logprobs


@pytest.mark.parametrize("verify", ["reproducible", "rejection"])
def test_logprobs_of_zero_step_cycles_are_plain_decodings(spec_pair, verify):
    """A cycle that drafts nothing takes the target's choice without the accept walk: its tokens (a sampled
    one drawn as plain decoding draws it, in either verify mode) and logprobs (greedy and sampled,
    processed) are plain decoding's, bit for bit."""
    target, heads = spec_pair
    params = [SamplingParams(max_new_tokens=12, ignore_eos=True, logprobs=2, **PROCESSED),
              SamplingParams(max_new_tokens=12, ignore_eos=True, logprobs=0, temperature=0.8, seed=3)]
    plain = run_plain(target, PROMPTS[:2], params)
    with build_engine(engine_overrides(target, "eagle", f"speculative.verify={verify}", head=heads["eagle"],
                                       num_steps=0)) as eng:
        spec = eng.generate(PROMPTS[:2], params)
    for s, o in zip(spec, plain):
        assert s.token_ids == o.token_ids and s.logprobs == o.logprobs and len(s.logprobs) == 12


def test_n_samples_of_a_prompt_take_consecutive_seeds(spec_pair):
    target, heads = spec_pair
    with build_engine(engine_overrides(target, "eagle", head=heads["eagle"])) as eng:
        outs = eng.generate(PROMPTS[:2], SamplingParams(max_new_tokens=12, temperature=1.0, seed=40, n=3))
        alone = eng.generate(PROMPTS[1], SamplingParams(max_new_tokens=12, temperature=1.0, seed=42))
        unseeded = eng.generate(PROMPTS[0], SamplingParams(max_new_tokens=12, temperature=1.0, n=2))
    assert [(o.prompt, o.index) for o in outs] == [(p, i) for p in PROMPTS[:2] for i in range(3)]
    assert outs[5].token_ids == alone[0].token_ids
    assert len({tuple(o.token_ids) for o in outs[:3]}) == 3 and unseeded[0].token_ids != unseeded[1].token_ids


def test_stop_token_ids_end_the_request_before_their_text(spec_pair):
    target, heads = spec_pair
    free = run_plain(target, PROMPTS[:1], SamplingParams(max_new_tokens=24, ignore_eos=True))[0]
    stop = free.token_ids[6]
    first = free.token_ids.index(stop)
    params = SamplingParams(max_new_tokens=24, stop_token_ids=[stop], ignore_eos=True)
    with build_engine(engine_overrides(target, "eagle", head=heads["eagle"], num_steps=4)) as eng:
        (out,) = eng.generate(PROMPTS[:1], params)
        tokenizer = eng.tokenizer
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[:first + 1]
    assert out.text == tokenizer.decode(free.token_ids[:first])


@pytest.mark.parametrize("field,value,message", [
    ("presence_penalty", 2.5, r"sampling.presence_penalty must be in \[-2.0, 2.0\]"),
    ("frequency_penalty", "0.3", r"sampling.frequency_penalty"),
    ("repetition_penalty", 0.0, r"sampling.repetition_penalty must be in \(0, 10.0\]"),
    ("min_p", -0.1, r"sampling.min_p must be in \[0, 1\]"),
    ("logit_bias", {"7": 1.0}, r"sampling.logit_bias keys must be token ids"),
    ("logit_bias", {7: 150.0}, r"sampling.logit_bias\[7\] must be in \[-100.0, 100.0\]"),
    ("logprobs", 21, r"sampling.logprobs must be an integer in \[0, 20\]"),
    ("n", 0, r"sampling.n must be an integer in \[1, 64\]"),
    ("stop_token_ids", [3, -1], r"sampling.stop_token_ids must be a list of token ids"),
])
def test_bad_values_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        SamplingParams(**{field: value})


def test_token_ids_past_the_vocabulary_are_refused_before_anything_runs(gqa_checkpoint):
    with build_engine(engine_overrides(gqa_checkpoint)) as eng:
        for params, field in ((SamplingParams(logit_bias={10**6: 1.0}), "logit_bias"),
                              (SamplingParams(stop_token_ids=[10**6]), "stop_token_ids")):
            with pytest.raises(ConfigError, match=rf"sampling.{field}: token id 1000000 is not in the vocabulary"):
                eng.generate(["def f():", "x = 1"], [SamplingParams(max_new_tokens=2), params])
        assert not eng.has_work() and eng.scheduler.kv.all_free()


@pytest.mark.parametrize("weights", [[], ["model.weight_layout=transposed"], ["model.quantization=int8"]],
                         ids=["auto", "transposed", "int8"])
def test_logprobs_of_the_shipped_pair_are_bit_identical_under_speculation(weights):
    """Forwards that carry a logprobs request attend batch-invariant and run row-invariant GEMMs (oneDNN's
    and the quantized kernels as they are, a dense GEMM one row per call), so a verify computes each
    position bit for bit as a decode does: equal logprobs, not close, in every weight format."""
    params = SamplingParams(max_new_tokens=24, logprobs=3, presence_penalty=0.3, ignore_eos=True)
    prompts = ["def fibonacci(n):", "import os\n"]
    runs = []
    for overrides in (["speculative=none", "draft=none"], ["adaptive=off", "speculative.num_steps=3"]):
        with build_engine([*weights, *overrides]) as eng:
            runs.append(eng.generate(prompts, params))
            assert overrides[0] == "speculative=none" or eng.metrics()["mean_accept_length"] > 1.2
    for plain, spec in zip(*runs):
        assert spec.token_ids == plain.token_ids and spec.logprobs == plain.logprobs


@pytest.mark.parametrize("algorithm", ["none", "eagle3", "ngram"])
def test_n_samples_prefill_their_prompt_once(spec_pair, gqa_checkpoint, algorithm):
    """The target runs the prompt's forward once for all n samples (the others copy its KV), and each
    sample's tokens are those it gets alone (under speculative.verify=reproducible, as plain decoding's).
    The EAGLE-3 pair's target reads little context; the others run on one that does (a sample without
    the prompt's KV would differ)."""
    target, heads = spec_pair if algorithm == "eagle3" else (gqa_checkpoint, {})
    prompt = PROMPTS[2]
    params = SamplingParams(max_new_tokens=12, temperature=0.9, seed=8, n=3, frequency_penalty=0.2, ignore_eos=True)
    with build_engine(engine_overrides(target, algorithm, head=heads.get(algorithm))) as eng:
        runner = eng.worker.runner if algorithm == "none" else eng.worker.target_runner
        forward, extended = runner.forward, []

        def recorded(batch, *args, **kwargs):
            extended.append(sum(batch.extend_lens))
            return forward(batch, *args, **kwargs)

        runner.forward = recorded
        outs = eng.generate(prompt, params)
        prompt_len = len(outs[0].prompt_token_ids)
        assert extended[0] == prompt_len and eng.scheduler.kv.all_free()
    alone = run_plain(target, [prompt] * 3, [SamplingParams(max_new_tokens=12, temperature=0.9, seed=8 + i,
                                                            frequency_penalty=0.2, ignore_eos=True) for i in range(3)])
    assert [o.token_ids for o in outs] == [o.token_ids for o in alone]
    assert len({tuple(o.token_ids) for o in outs}) == 3


@pytest.mark.parametrize("setting,expected", [(None, True), ("false", False)])
def test_only_the_forwards_of_logprobs_requests_run_exact(spec_pair, setting, expected):
    """`attention.exact_logprobs` (null: on with torch_native) marks the target forwards that carry a
    logprobs request, and only those: the others keep the batched kernels."""
    target, heads = spec_pair
    extra = [] if setting is None else [f"attention.exact_logprobs={setting}"]
    with build_engine(engine_overrides(target, "eagle3", *extra, head=heads["eagle3"])) as eng:
        runner = eng.worker.target_runner
        forward, marks = runner.forward, []

        def recorded(batch, *args, **kwargs):
            marks.append(batch.exact)
            return forward(batch, *args, **kwargs)

        runner.forward = recorded
        eng.generate(PROMPTS[:2], SamplingParams(max_new_tokens=6, ignore_eos=True))
        assert marks and not any(marks)
        marks.clear()
        eng.generate(PROMPTS[:2], SamplingParams(max_new_tokens=6, ignore_eos=True, logprobs=0))
        assert marks and all(m == expected for m in marks)


def test_exact_logprobs_resolve_on_with_the_torch_native_backend():
    from eyas.containers.factories import exact_logprobs

    assert exact_logprobs(None, "triton") is False and exact_logprobs(None, "torch_native") is True
    assert exact_logprobs(False, "torch_native") is False
