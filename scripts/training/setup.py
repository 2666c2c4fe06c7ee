"""What every training script does first: threads, seed, and the resolved corpus / tokenizer / work dirs."""

from pathlib import Path

import torch

from training.paths import resolve


def prepare(cfg) -> tuple[Path, Path, Path]:
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    torch.manual_seed(cfg.seed)
    return resolve(cfg.corpus_dir), resolve(cfg.tokenizer_dir), resolve(cfg.work_dir)
