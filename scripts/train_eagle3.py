"""Train an EAGLE-3 head for a target from its self-distilled answers (`distill.py`, `distill_features.py`).

    python scripts/train_eagle3.py [train.steps=3000] [ttt_steps=6] [device=cuda]

The head reads the target's features at position j and token j + 1 and predicts token j + 2; the
training-time test unrolls it `ttt_steps` steps as EAGLE-3 does (step s feeds the head its own hidden
from step s - 1 and attends to its own earlier steps' rows, `training/ttt_attention.py`), with step s's
loss weighted `ttt_weight ** s`. Labels are the target's own greedy tokens, scored on the answers only.
The draft vocabulary is the smallest set of tokens covering `draft_vocab_coverage` of what the target
emitted. Resumable; writes the head (Hugging Face layout, `export_dtype`) to `out_dir` and
`work_dir/report.json` (losses, top-1 agreement by depth, time).
"""

import json
import time

import hydra
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch.nn import functional as F

from eyas.engine.models.checkpoint_source import checkpoint_directory
from eyas.engine.models.eagle3 import Eagle3DraftModel
from eyas.engine.models.loader import load_model
from training.eagle3_export import export_eagle3
from training.curves import plot_curves
from training.feature_windows import FeatureWindows
from training.loop import train
from training.paths import resolve
from training.ttt_attention import TTTAttention, TTTBatch


def draft_vocabulary(windows: FeatureWindows, vocab_size: int, coverage: float, limit: int) -> tuple[torch.Tensor, float]:
    counts = windows.answer_token_counts(vocab_size)
    order = torch.argsort(counts, descending=True)
    cumulative = counts[order].cumsum(0).double() / counts.sum()
    size = min(limit, int(torch.searchsorted(cumulative, coverage)) + 1)
    size = (size + 63) // 64 * 64  # rows of the draft lm_head in whole blocks
    ids = torch.sort(order[:size]).values
    return ids, float(counts[ids].sum() / counts.sum())


def build_head(target, draft_ids: torch.Tensor, aux_layer_ids) -> Eagle3DraftModel:
    import dataclasses

    cfg = target.config
    head_cfg = dataclasses.replace(cfg, num_hidden_layers=1, architecture="LlamaForCausalLM", qkv_bias=False,
                                   o_bias=False, mlp_bias=False, qk_norm=False, sliding_window=None)
    head = Eagle3DraftModel(head_cfg, cfg.hidden_size, len(draft_ids), tuple(aux_layer_ids))
    for p in head.parameters():
        if p.dim() >= 2:
            torch.nn.init.normal_(p, std=0.02)
    with torch.no_grad():  # the draft lm_head starts from the target's rows of those tokens
        head.lm_head.weight.copy_(target.lm_head.weight[draft_ids])
    head.d2t.copy_(draft_ids - torch.arange(len(draft_ids)))
    head.t2d.zero_()
    head.t2d[draft_ids] = True
    object.__setattr__(head, "embed_tokens", target.model.embed_tokens)  # shared and frozen: not the head's
    return head


def unroll(head: Eagle3DraftModel, batch: dict, steps: int, target_to_draft: torch.Tensor):
    """Yields (step, logits [B, T, Vd], draft-vocab labels [B, T], mask [B, T])."""
    ids, feats, mask = batch["ids"], batch["features"], batch["answer_mask"]  # [B, T+2], [B, T, 3H], [B, T+2]
    b, t = feats.shape[:2]
    backend = TTTAttention()
    hidden = head.fc(feats.reshape(b * t, -1).to(head.fc.weight.dtype))
    j = torch.arange(t, device=ids.device)
    for s in range(steps):
        tokens = ids[:, (j + s + 1).clamp(max=ids.shape[1] - 1)].reshape(-1)
        positions = (j + s).repeat(b)
        hidden, _ = head(tokens, positions, TTTBatch(b, t, s, backend), hidden)
        logits = head.lm_head(head.norm(hidden)).view(b, t, -1)
        label_at = (j + s + 2).clamp(max=ids.shape[1] - 1)
        labels = target_to_draft[ids[:, label_at]]
        valid = mask[:, label_at] & (j + s + 2 < ids.shape[1])[None, :] & (labels >= 0)
        yield s, logits, labels.clamp(min=0), valid


@hydra.main(config_path="conf", config_name="eagle3", version_base="1.3")
def main(cfg: DictConfig) -> None:
    device = torch.device(cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    torch.manual_seed(cfg.seed)
    work_dir = resolve(cfg.work_dir)
    target = load_model(checkpoint_directory(cfg.target), dtype="float32", weight_layout="linear")
    windows = FeatureWindows(resolve(cfg.data_dir), cfg.valid_shards)
    draft_ids, coverage = draft_vocabulary(windows, target.config.vocab_size, cfg.draft_vocab_coverage,
                                           cfg.max_draft_vocab)
    print(f"{windows.describe()}; draft vocabulary: {len(draft_ids)} tokens cover {coverage:.2%} of the answers")
    head = build_head(target, draft_ids, windows.aux_layer_ids).to(device)
    head.embed_tokens.to(device)
    target_to_draft = torch.full((target.config.vocab_size,), -1, dtype=torch.long)
    target_to_draft[draft_ids] = torch.arange(len(draft_ids))
    target_to_draft = target_to_draft.to(device)
    generator = torch.Generator().manual_seed(cfg.seed)
    t = cfg.train

    def loss_fn(gen):
        batch = windows.sample(t.batch_size, t.seq_len, gen, device)
        loss = 0.0
        for s, logits, labels, valid in unroll(head, batch, cfg.ttt_steps, target_to_draft):
            ce = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none")
            loss = loss + cfg.ttt_weight ** s * (ce * valid.flatten()).sum() / valid.sum().clamp(min=1)
        return loss

    @torch.no_grad()
    def on_eval(step):
        hits, counts = [0.0] * cfg.eval_depths, [0.0] * cfg.eval_depths
        chain = [0.0] * cfg.eval_depths  # the first s + 1 steps all right: what a chain accepts
        for batch in windows.validation(t.batch_size, t.seq_len, t.eval_windows, device):
            alive = None
            for s, logits, labels, valid in unroll(head, batch, cfg.eval_depths, target_to_draft):
                right = (logits.argmax(-1) == labels) & valid
                alive = right if alive is None else alive & right
                hits[s] += float(right.sum())
                chain[s] += float(alive.sum())
                counts[s] += float(valid.sum())
        top1 = [h / max(c, 1) for h, c in zip(hits, counts)]
        accepted = [c / max(counts[0], 1) for c in chain]
        return {"top1_by_depth": [round(x, 4) for x in top1], "chain_accept_by_depth": [round(x, 4) for x in accepted],
                "tau_estimate": round(1 + sum(accepted), 3)}

    start = time.perf_counter()
    summary = train(head, loss_fn, t, work_dir / "state.pt", generator, on_eval, label="eagle3")
    out_dir = resolve(cfg.out_dir)
    export_eagle3(head.cpu(), target.config, out_dir, getattr(torch, cfg.export_dtype))
    report = {**summary, "draft_vocab_size": len(draft_ids), "draft_vocab_coverage": coverage,
              "data": windows.describe(), "device": str(device), "wall_s_this_run": time.perf_counter() - start,
              "config": OmegaConf.to_container(cfg)}
    (work_dir / "report.json").write_text(json.dumps(report, indent=2))
    plot_curves(summary["log"], out_dir / "training.png", f"EAGLE-3 head for {cfg.target}: {summary['steps']} steps")
    print(f"head written to {out_dir}; report in {work_dir / 'report.json'}")


if __name__ == "__main__":
    main()
