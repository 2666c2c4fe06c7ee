"""Tiny random Hugging Face Llama checkpoints and tokenizers, written with `transformers` (the oracle)."""

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "import os\nimport sys\nprint(os.getcwd())\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
]


def write_tokenizer(directory: Path, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
    return tok


def write_llama(directory: Path, *, vocab_size=320, hidden_size=64, intermediate_size=128, num_layers=2,
                num_heads=4, num_kv_heads=2, tie=False, rope_theta=10000.0, rope_scaling=None,
                attention_bias=False, init_std=0.25, seed=0, max_position_embeddings=512,
                with_tokenizer=True, dtype=torch.float32, max_shard_size=None) -> Path:
    """Write a random LlamaForCausalLM with `transformers`; wide init keeps greedy output varied."""
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    if with_tokenizer:
        write_tokenizer(directory, vocab_size)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings, rope_theta=rope_theta, rope_scaling=rope_scaling,
        tie_word_embeddings=tie, attention_bias=attention_bias, initializer_range=init_std,
        bos_token_id=0, eos_token_id=1, pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(dtype)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, safe_serialization=True, **kwargs)
    return directory
