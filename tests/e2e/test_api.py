"""The public library API that benchmarks and outside checks use."""

import pytest
from support import build_engine
from support.engines import PLAIN

from eyas import ConfigError, RequestOutput, SamplingParams


def test_public_api(gqa_checkpoint):
    eng = build_engine(overrides=[*PLAIN, f"model.path={gqa_checkpoint}", "speculative=none"])
    outs = eng.generate(["def add(a, b):", "import os"], SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True))
    assert all(isinstance(o, RequestOutput) for o in outs)
    assert len(outs[0].token_ids) == 6 and isinstance(outs[0].text, str)
    assert outs[0].stats["generated_tokens"] == 6 and outs[0].stats["prompt_tokens"] == len(outs[0].prompt_token_ids)
    assert outs[0].text == eng.tokenizer.decode(outs[0].token_ids)
    ids = eng.generate(prompt_token_ids=[[0, 2, 3]], sampling=SamplingParams(max_new_tokens=8, ignore_eos=True))
    assert len(ids[0].token_ids) == 8 and ids[0].prompt_token_ids == [0, 2, 3]
    metrics = eng.metrics()
    assert metrics["generated_tokens"] == 20 and metrics["num_requests"] == 3 and metrics["tokens_per_s"] > 0
    eng.close()
    with pytest.raises(RuntimeError, match="closed"):
        eng.generate(["x"])


def test_context_manager_and_default_sampling(gqa_checkpoint):
    with build_engine([*PLAIN, f"model.path={gqa_checkpoint}", "sampling.max_new_tokens=5", "sampling.ignore_eos=true"]) as eng:
        assert len(eng.generate("import os")[0].token_ids) == 5
    assert eng.closed


def test_argument_errors(gqa_checkpoint):
    with build_engine([*PLAIN, f"model.path={gqa_checkpoint}"]) as eng:
        with pytest.raises(ConfigError, match="exactly one"):
            eng.generate(["a"], prompt_token_ids=[[1]])
        with pytest.raises(ConfigError, match="2 prompts"):
            eng.generate(["a", "b"], [SamplingParams()])
    with pytest.raises(ConfigError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ConfigError, match="top_p"):
        SamplingParams(top_p=2.0)
