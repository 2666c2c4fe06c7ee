"""EAGLE and EAGLE-3 heads trained for a few seconds on a fixture target's own sampled outputs, so the
speculative tests run with drafts that are really accepted (ragged acceptance at every depth).

The losses, the training-time-test unroll and the export are the training script's own
(`scripts/train_heads.py`); only the data (the target's samples) and the schedule are the fixture's.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from train_heads import Heads, eagle3_unroll, eagle_loss, export, soft_ce, target_pass  # noqa: E402

from eyas import SamplingParams  # noqa: E402
from eyas.engine.models.loader import load_model  # noqa: E402
from support import build_engine  # noqa: E402


def sampled_windows(target_dir: Path, num: int, length: int, seed: int) -> torch.Tensor:
    """[num, length] token windows: short random prompts continued by the target at T = 1."""
    gen = torch.Generator().manual_seed(seed)
    with build_engine(["speculative=none", "draft=none", f"model.path={target_dir}",
                       f"cache.max_running_requests={num}"]) as eng:
        vocab = eng.worker.runner.model.config.vocab_size
        prompts = [[0, *torch.randint(2, vocab, (3,), generator=gen).tolist()] for _ in range(num)]
        params = [SamplingParams(max_new_tokens=length - 4, temperature=1.0, seed=seed * 10_000 + i, ignore_eos=True)
                  for i in range(num)]
        outs = eng.generate(prompt_token_ids=prompts, sampling=params)
    return torch.tensor([p + o.token_ids for p, o in zip(prompts, outs)])


def train_heads(target_dir: Path, eagle_dir: Path, eagle3_dir: Path, *, steps: int = 150, draft_vocab_size: int = 200,
                seed: int = 0) -> None:
    torch.manual_seed(seed)
    windows = sampled_windows(target_dir, 96, 48, seed)
    target = load_model(target_dir, dtype="float32", weight_layout="linear")  # its weights are read: dense
    num_layers = target.config.num_hidden_layers
    aux_layer_ids = (min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0))
    counts = torch.bincount(windows.flatten(), minlength=target.config.vocab_size)
    draft_vocab_ids = torch.sort(counts.topk(draft_vocab_size).indices).values
    heads = Heads(target, draft_vocab_ids)
    optimizer = torch.optim.Adam(heads.head_parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = windows[torch.randint(0, len(windows), (16,), generator=gen)]
        hidden, aux, probs = target_pass(target, batch, aux_layer_ids)
        loss, _ = eagle_loss(heads, batch, hidden, probs, ce_weight=0.1)
        for s, logits, draft_probs, valid, _ in eagle3_unroll(heads, batch, aux, probs, steps=3):
            loss = loss + 0.8 ** s * soft_ce(logits, draft_probs, valid)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    cfg = SimpleNamespace(out_dir=SimpleNamespace(eagle=eagle_dir, eagle3=eagle3_dir), export_dtype="float32")
    export(heads, target, cfg, {}, aux_layer_ids)
