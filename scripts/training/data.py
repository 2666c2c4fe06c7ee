"""Token streams of the corpus splits, cached, and random training windows over them."""

import json
from pathlib import Path

import torch

from eyas.engine.tokenizer import Tokenizer


def token_stream(corpus_dir: Path, tokenizer_dir: Path, split: str, cache_dir: Path) -> torch.Tensor:
    """Every file of `split` as [bos] + tokens + [eos], concatenated: [T] int32 (cached on disk)."""
    cache = cache_dir / f"{split}_tokens.pt"
    if cache.is_file():
        return torch.load(cache)
    tok = Tokenizer.from_dir(tokenizer_dir)
    raw = tok._tok  # the `tokenizers` object: encode without the bos template, add bos/eos here
    bos, eos = raw.token_to_id("<s>"), tok.eos_token_ids[0]
    docs = json.loads((corpus_dir / f"{split}.json").read_text())
    ids = []
    for encoding in raw.encode_batch([d["text"] for d in docs], add_special_tokens=False):
        ids.extend([bos, *encoding.ids, eos])
    stream = torch.tensor(ids, dtype=torch.int32)
    cache_dir.mkdir(parents=True, exist_ok=True)
    torch.save(stream, cache)
    return stream


def random_windows(stream: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """[B, seq_len + 1] windows at random offsets (inputs and next-token targets)."""
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch_size,), generator=generator)
    return torch.stack([stream[s:s + seq_len + 1] for s in starts.tolist()]).long()


def fixed_windows(stream: torch.Tensor, seq_len: int, max_windows: int) -> torch.Tensor:
    """Non-overlapping windows from the start of the stream, for evaluation: [W, seq_len + 1]."""
    n = min(max_windows, (len(stream) - 1) // seq_len)
    return torch.stack([stream[i * seq_len:i * seq_len + seq_len + 1] for i in range(n)]).long()
