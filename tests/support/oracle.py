"""Hugging Face transformers as the oracle: its model of a checkpoint and its greedy generate."""

import json

import torch

# compared against transformers: prompts of unequal token lengths (asserted), prose next to code
ORACLE_PROMPTS = ["def add(a, b):", "import os\nimport sys", "class Point:\n    def __init__(self, x, y):",
                  "for", "The quick brown fox jumps over the lazy dog. The quick brown"]


def hf_model(path):
    """transformers' model class of the checkpoint's architecture, loaded in float32."""
    import transformers

    model_class = getattr(transformers, json.loads((path / "config.json").read_text())["architectures"][0])
    model = model_class.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # never stop early: compare full lengths
    return model


def hf_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()
