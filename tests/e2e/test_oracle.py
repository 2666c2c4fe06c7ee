"""Our greedy output equals Hugging Face transformers' greedy generate, token for token (float32), for
every supported family: Llama (GQA, tied llama3 RoPE, linear RoPE with biases), Qwen2, Qwen3, Mistral."""


import pytest
import torch
from support import build_engine
from support.engines import PLAIN
from support.oracle import ORACLE_PROMPTS, hf_greedy, hf_model

from eyas import SamplingParams
from eyas.engine.forward_batch import ForwardBatch

NEW_TOKENS = 40
OTHER_FAMILIES = ["qwen2", "qwen3", "mistral"]


@pytest.mark.parametrize("name", ["gqa", "tied_llama3", *OTHER_FAMILIES])
@pytest.mark.parametrize("page_size", [1, 16])
def test_greedy_batch_equals_transformers(checkpoint, name, page_size):
    path = checkpoint(name)
    with build_engine([*PLAIN, f"model.path={path}", f"cache.page_size={page_size}", "cache.max_total_tokens=2048"]) as eng:
        outs = eng.generate(ORACLE_PROMPTS, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True))
    lengths = {len(o.prompt_token_ids) for o in outs}
    assert len(lengths) == len(ORACLE_PROMPTS), "prompts must have unequal lengths"
    model = hf_model(path)
    for out in outs:
        assert len(set(out.token_ids)) > NEW_TOKENS // 4, "degenerate fixture: greedy output collapsed"
        assert out.token_ids == hf_greedy(model, out.prompt_token_ids, NEW_TOKENS)


@pytest.mark.parametrize("name", ["gqa", "tied_llama3", "linear_bias", *OTHER_FAMILIES])
def test_prefill_logits_equal_transformers(checkpoint, name):
    """All-position logits of one extend forward, for every rope variant, attention bias and family."""
    path = checkpoint(name)
    ids = [0, 17, 93, 5, 250, 41, 77, 8, 199, 3, 64]
    with build_engine([*PLAIN, f"model.path={path}"]) as eng:
        runner, table = eng.worker.runner, eng.scheduler.kv.table.table
        row = eng.scheduler.kv.admit(len(ids))
        batch = ForwardBatch.from_tails([row], [ids], [0], table)
        ours = runner.forward(batch, logits_indices=torch.arange(len(ids))).logits
        eng.scheduler.kv.release(row)
    with torch.no_grad():
        theirs = hf_model(path)(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
