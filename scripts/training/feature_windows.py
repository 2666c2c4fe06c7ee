"""Training windows over the target features `distill_features.py` wrote: token ids, the three aux
layers' inputs (float16, memory-mapped) and which positions are answer tokens."""

import json
from pathlib import Path

import numpy as np
import torch


class FeatureWindows:
    """Every `feat-NNNNN` shard of `data_dir`; the last `valid_shards` are held out for evaluation."""

    def __init__(self, data_dir: Path, valid_shards: int):
        shards = sorted(data_dir.glob("feat-*.json"))
        if len(shards) <= valid_shards:
            raise SystemExit(f"{data_dir}: {len(shards)} featurized shards; need more than valid_shards="
                             f"{valid_shards} (run scripts/distill.py, then scripts/distill_features.py)")
        self.windows: dict[str, list[tuple[np.ndarray, dict]]] = {"train": [], "valid": []}
        for i, meta_file in enumerate(shards):
            meta = json.loads(meta_file.read_text())
            self.aux_layer_ids = tuple(meta["aux_layer_ids"])
            features = np.load(meta_file.with_suffix(".npy"), mmap_mode="r")
            split = "valid" if i >= len(shards) - valid_shards else "train"
            self.windows[split] += [(features, w) for w in meta["windows"]]
        self.num_shards = len(shards)

    def describe(self) -> str:
        tokens = {k: sum(len(w["ids"]) for _, w in v) for k, v in self.windows.items()}
        answers = {k: sum(len(w["ids"]) - w["answer_from"] for _, w in v) for k, v in self.windows.items()}
        return (f"{self.num_shards} shards: {len(self.windows['train'])} train windows ({tokens['train']} tokens, "
                f"{answers['train']} answer tokens), {len(self.windows['valid'])} validation windows "
                f"({answers['valid']} answer tokens)")

    def answer_token_counts(self, vocab_size: int) -> torch.Tensor:
        ids = np.concatenate([np.asarray(w["ids"][w["answer_from"]:]) for _, w in self.windows["train"]])
        return torch.bincount(torch.from_numpy(ids).long(), minlength=vocab_size)

    def _batch(self, picked: list[tuple[np.ndarray, dict, int]], seq_len: int, device) -> dict:
        """picked: (features, window, start). Each row: features of positions start..start+T-1 and the
        ids of start..start+T+1 (two more: the token fed at step 0 and the label), zero-padded."""
        b = len(picked)
        width = picked[0][0].shape[1]
        ids = torch.zeros(b, seq_len + 2, dtype=torch.long)
        mask = torch.zeros(b, seq_len + 2, dtype=torch.bool)
        feats = torch.zeros(b, seq_len, width, dtype=torch.float16)
        for row, (features, w, start) in enumerate(picked):
            window_ids = w["ids"][start:start + seq_len + 2]
            n = min(seq_len, len(w["ids"]) - start)
            ids[row, :len(window_ids)] = torch.tensor(window_ids)
            answer_from = max(0, w["answer_from"] - start)
            mask[row, answer_from:len(window_ids)] = True
            offset = w["offset"] + start
            feats[row, :n] = torch.from_numpy(np.asarray(features[offset:offset + n]))
        return {"ids": ids.to(device), "answer_mask": mask.to(device), "features": feats.to(device).float()}

    def sample(self, batch_size: int, seq_len: int, generator: torch.Generator, device) -> dict:
        train = self.windows["train"]
        picks = torch.randint(0, len(train), (batch_size,), generator=generator).tolist()
        picked = []
        for i in picks:
            features, w = train[i]
            # start anywhere that keeps at least one answer token in view
            last = max(0, len(w["ids"]) - 2 - 1)
            first = max(0, min(w["answer_from"] - seq_len // 4, last))
            start = int(torch.randint(first, max(first, last - seq_len // 2) + 1, (1,), generator=generator))
            picked.append((features, w, min(start, last)))
        return self._batch(picked, seq_len, device)

    def validation(self, batch_size: int, seq_len: int, max_windows: int, device):
        """The first `max_windows` validation windows from their start, in batches."""
        valid = self.windows["valid"][:max_windows]
        for i in range(0, len(valid), batch_size):
            yield self._batch([(f, w, 0) for f, w in valid[i:i + batch_size]], seq_len, device)
