"""The target's features for EAGLE-3 training, computed once per distilled shard.

    python scripts/distill_features.py [target=/x/model.gguf]

For each `train-NNNNN.jsonl` that `scripts/distill.py` wrote, runs the target (float32, dequantized) over
every prompt + answer and keeps, for the answer and the `context_tokens` prompt tokens before it, the inputs
of the three layers an EAGLE-3 head reads: `feat-NNNNN.npy` (float16 [tokens, 3 * hidden]) and
`feat-NNNNN.json` (each window's token ids, its offset into the features, where its answer starts).
Resumable per shard; shards still being generated are picked up by the next run.
"""

import json
import os
import time

import hydra
import numpy as np
import torch
from omegaconf import DictConfig

from eyas.engine.attention.dense import dense_batch, dense_positions
from eyas.engine.models.checkpoint_source import checkpoint_directory
from eyas.engine.models.loader import load_model
from training.paths import resolve


def aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    return 2, num_layers // 2, num_layers - 3  # EAGLE-3's low / middle / high layers


@torch.no_grad()
def features_of(target, ids: list[int], layers) -> torch.Tensor:
    tokens = torch.tensor(ids, device=target.lm_head.weight.device)
    _, aux = target(tokens, dense_positions(1, len(ids), tokens.device), dense_batch(1, len(ids)), layers)
    return torch.cat(aux, -1)  # [T, 3H]


@hydra.main(config_path="conf", config_name="distill", version_base="1.3")
def main(cfg: DictConfig) -> None:
    if cfg.features.threads:
        torch.set_num_threads(cfg.features.threads)
    out = resolve(cfg.out_dir)
    todo = sorted(p for p in out.glob("train-*.jsonl") if not (out / p.name.replace("train-", "feat-")
                                                               .replace(".jsonl", ".json")).is_file())
    print(f"{len(todo)} shards to featurize in {out}")
    if not todo:
        return
    device = cfg.features.device if cfg.features.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    target = load_model(checkpoint_directory(cfg.target), dtype="float32", device=device, weight_layout="linear")
    layers = aux_layer_ids(target.config.num_hidden_layers)
    for shard in todo:
        start = time.perf_counter()
        rows = [json.loads(line) for line in shard.read_text().splitlines()]
        windows, chunks, offset = [], [], 0
        for row in rows:
            prompt, answer = row["prompt_ids"], row["output_ids"]
            if len(answer) < 2:
                continue
            feats = features_of(target, prompt + answer, layers)
            keep = min(len(prompt), cfg.features.context_tokens)
            first = len(prompt) - keep
            chunks.append(feats[first:].to(torch.float16).cpu().numpy())
            windows.append({"ids": (prompt + answer)[first:], "offset": offset, "answer_from": keep})
            offset += len(prompt) + len(answer) - first
        stem = shard.name.replace("train-", "feat-").replace(".jsonl", "")
        np.save(out / f"{stem}.tmp.npy", np.concatenate(chunks))
        os.replace(out / f"{stem}.tmp.npy", out / f"{stem}.npy")
        (out / f"{stem}.json.tmp").write_text(json.dumps({"aux_layer_ids": list(layers), "windows": windows}))
        os.replace(out / f"{stem}.json.tmp", out / f"{stem}.json")  # last: marks the shard done
        print(f"{shard.name}: {offset} tokens in {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
