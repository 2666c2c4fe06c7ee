"""Train an EAGLE-1/2 head and an EAGLE-3 head on the frozen target; export both in the published layouts.

    python scripts/train_heads.py [train.steps=600] [ttt_steps=4]

One target forward per batch feeds both heads. EAGLE-1: feature regression (SmoothL1) plus 0.1 x
cross-entropy to the target's distribution. EAGLE-3: training-time test unrolled `ttt_steps` steps,
cross-entropy to the target's distribution over the draft vocabulary, step losses weighted 0.8^s.
Resumable; writes `work_dir/report.json` with top-1 agreement at draft depths 1..eval_depths.
"""

import dataclasses
import json

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from torch.nn import functional as F

from eyas.engine.attention.dense import dense_batch, dense_positions
from eyas.engine.models.eagle import EagleDraftModel
from eyas.engine.models.eagle3 import Eagle3DraftModel
from eyas.engine.models.loader import load_model
from training.data import fixed_windows, random_windows, token_stream
from training.export import save_hf_dir
from training.loop import train
from training.paths import resolve
from training.setup import prepare
from training.ttt_attention import TTTAttention, TTTBatch


class Heads(torch.nn.Module):
    def __init__(self, target, draft_vocab_ids: torch.Tensor):
        super().__init__()
        cfg = target.config
        # one plain Llama decoder layer whatever the target's family (the published head layouts)
        head_cfg = dataclasses.replace(cfg, num_hidden_layers=1, architecture="LlamaForCausalLM", qkv_bias=False,
                                       o_bias=False, mlp_bias=False, qk_norm=False, sliding_window=None)
        self.eagle = EagleDraftModel(head_cfg, fc_bias=True)
        self.eagle3 = Eagle3DraftModel(head_cfg, cfg.hidden_size, len(draft_vocab_ids))
        self.eagle3.d2t.copy_(draft_vocab_ids - torch.arange(len(draft_vocab_ids)))
        self.eagle3.t2d.zero_()
        self.eagle3.t2d[draft_vocab_ids] = True
        with torch.no_grad():  # start the draft lm_head from the target's rows of those tokens
            self.eagle3.lm_head.weight.copy_(target.lm_head.weight[draft_vocab_ids])
        for p in self.parameters():
            if p.dim() >= 2 and p is not self.eagle3.lm_head.weight:
                torch.nn.init.normal_(p, std=0.02)
        # shared, frozen: not parameters of the heads
        object.__setattr__(self, "target", target)
        self.eagle.embed_tokens = self.eagle3.embed_tokens = target.model.embed_tokens
        self.eagle.share_target_lm_head(target)
        self.draft_vocab_ids = draft_vocab_ids

    def head_parameters(self):
        shared = {id(self.target.model.embed_tokens.weight), id(self.target.lm_head.weight)}
        return [p for p in self.parameters() if id(p) not in shared]


@torch.no_grad()
def target_pass(target, windows: torch.Tensor, aux_layer_ids: tuple[int, ...]):
    """[B, T+1] windows -> final hidden [B, T, H], aux [B, T, 3H] (the inputs of `aux_layer_ids`),
    probs [B, T, V] over x_0..x_{T-1}."""
    b, t = windows.shape[0], windows.shape[1] - 1
    inputs = windows[:, :-1].reshape(-1)
    hidden, aux = target(inputs, dense_positions(b, t, inputs.device), dense_batch(b, t), aux_layer_ids)
    probs = target.compute_logits(hidden).softmax(-1)
    return hidden.view(b, t, -1), torch.cat(aux, -1).view(b, t, -1), probs.view(b, t, -1)


def soft_ce(logits: torch.Tensor, target_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    loss = -(target_probs * logits.float().log_softmax(-1)).sum(-1)
    return (loss * mask).sum() / mask.sum().clamp(min=1)


def eagle_loss(heads: Heads, windows, hidden, probs, ce_weight: float):
    # row j (0..T-2): token x_{j+1} with feature f_j -> predicted f_{j+1}; CE to p_{j+1}
    b, t = hidden.shape[:2]
    n = t - 1
    tokens = windows[:, 1:t].reshape(-1)
    feats = hidden[:, :n].reshape(-1, hidden.shape[-1])
    pred, _ = heads.eagle(tokens, dense_positions(b, n, tokens.device), dense_batch(b, n), feats)
    regression = F.smooth_l1_loss(pred.float(), hidden[:, 1:].reshape(-1, hidden.shape[-1]))
    ce = soft_ce(heads.eagle.compute_logits(pred), probs[:, 1:].reshape(-1, probs.shape[-1]),
                 torch.ones(b * n, device=pred.device))
    return regression + ce_weight * ce, pred.view(b, n, -1)


def eagle3_unroll(heads: Heads, windows, aux, probs, steps: int):
    """Yields (step, draft-vocab logits [B, T-1, Vd], target probs on the draft vocab, valid mask)."""
    b, t = aux.shape[:2]
    n = t - 1
    backend = TTTAttention()
    features = heads.eagle3.target_features(None, [aux[:, :n].reshape(b * n, -1)])
    draft_probs_all = probs[..., heads.draft_vocab_ids]
    draft_probs_all = draft_probs_all / draft_probs_all.sum(-1, keepdim=True).clamp(min=1e-9)
    hidden = features
    j = torch.arange(n, device=aux.device)
    for s in range(steps):
        tok_idx = (j + s + 1).clamp(max=t)  # token x_{j+s+1} (the window has T+1 tokens)
        tokens = windows[:, tok_idx].reshape(-1)
        positions = (j + s).repeat(b)
        hidden, _ = heads.eagle3(tokens, positions, TTTBatch(b, n, s, backend), hidden)
        logits = heads.eagle3.lm_head(heads.eagle3.norm(hidden)).view(b, n, -1)
        tgt_idx = (j + s + 1).clamp(max=t - 1)
        valid = (j + s + 1 <= t - 1).float()[None, :].expand(b, n)
        yield s, logits, draft_probs_all[:, tgt_idx], valid, probs[:, tgt_idx]


def export(heads: Heads, target, cfg, ttt_report: dict, aux_layer_ids: tuple[int, ...]):
    tc = target.config
    common = {
        "model_type": "llama", "hidden_size": tc.hidden_size, "intermediate_size": tc.intermediate_size,
        "num_attention_heads": tc.num_attention_heads, "num_key_value_heads": tc.num_key_value_heads,
        "head_dim": tc.head_dim, "num_hidden_layers": 1, "vocab_size": tc.vocab_size,
        "max_position_embeddings": tc.max_position_embeddings, "rms_norm_eps": tc.rms_norm_eps,
        "rope_theta": tc.rope_theta, "hidden_act": "silu", "torch_dtype": "float32",
    }
    dtype = getattr(torch, cfg.export_dtype)
    eagle_state = {k: v for k, v in heads.eagle.state_dict().items() if k.startswith(("fc.", "layers."))}
    save_hf_dir(resolve(cfg.out_dir.eagle), {"architectures": ["LlamaForCausalLM"], "bias": True, **common},
                eagle_state, dtype)
    e3 = heads.eagle3
    e3_state = {k: v for k, v in e3.state_dict().items() if k.startswith(("fc.", "midlayer.", "norm.", "lm_head."))}
    e3_config = {"architectures": ["LlamaForCausalLMEagle3"], **common, "draft_vocab_size": e3.draft_vocab_size,
                 "target_hidden_size": tc.hidden_size, "tie_word_embeddings": False,
                 "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids)}}
    save_hf_dir(resolve(cfg.out_dir.eagle3), e3_config, e3_state, dtype)
    from safetensors.torch import load_file, save_file  # d2t / t2d keep their integer / bool dtypes

    path = resolve(cfg.out_dir.eagle3) / "model.safetensors"
    tensors = load_file(str(path))
    tensors["d2t"], tensors["t2d"] = e3.d2t.clone(), e3.t2d.clone()
    save_file(tensors, str(path), metadata={"format": "pt"})


@hydra.main(config_path="conf", config_name="heads", version_base="1.3")
def main(cfg: DictConfig) -> None:
    corpus_dir, tok_dir, work_dir = prepare(cfg)
    target = load_model(resolve(cfg.target_dir), dtype="float32", weight_layout="linear")  # its weights are read: dense
    num_layers = target.config.num_hidden_layers
    aux_layer_ids = (2, num_layers // 2, num_layers - 3)
    cache_dir = resolve(cfg.work_dir) / "data"
    streams = {s: token_stream(corpus_dir, tok_dir, s, cache_dir) for s in ("train", "valid")}
    counts = torch.bincount(streams["train"].long(), minlength=target.config.vocab_size)
    draft_vocab_ids = torch.sort(counts.topk(cfg.draft_vocab_size).indices).values
    coverage = float(counts[draft_vocab_ids].sum() / counts.sum())
    print(f"draft vocabulary: {cfg.draft_vocab_size} tokens cover {coverage:.1%} of the train split")
    heads = Heads(target, draft_vocab_ids)
    evals = fixed_windows(streams["valid"], cfg.train.seq_len, cfg.train.eval_windows)
    generator = torch.Generator().manual_seed(cfg.seed)
    t = cfg.train

    def loss_fn(gen):
        windows = random_windows(streams["train"], t.batch_size, t.seq_len, gen)
        hidden, aux, probs = target_pass(target, windows, aux_layer_ids)
        loss, _ = eagle_loss(heads, windows, hidden, probs, cfg.eagle_ce_weight)
        for s, logits, tgt, valid, _ in eagle3_unroll(heads, windows, aux, probs, cfg.ttt_steps):
            loss = loss + cfg.ttt_weight ** s * soft_ce(logits, tgt, valid)
        return loss

    @torch.no_grad()
    def on_eval(step):
        agree = [0.0] * cfg.eval_depths
        eagle1_agree = 0.0
        for i in range(0, len(evals), 8):
            windows = evals[i:i + 8]
            hidden, aux, probs = target_pass(target, windows, aux_layer_ids)
            _, pred = eagle_loss(heads, windows, hidden, probs, cfg.eagle_ce_weight)
            target_next = probs[:, 1:].argmax(-1)
            eagle1_agree += float((heads.eagle.compute_logits(pred).argmax(-1) == target_next).float().mean())
            for s, logits, _, valid, full in eagle3_unroll(heads, windows, aux, probs, cfg.eval_depths):
                hit = (draft_vocab_ids[logits.argmax(-1)] == full.argmax(-1)).float()
                agree[s] += float((hit * valid).sum() / valid.sum())
        batches = (len(evals) + 7) // 8
        return {"eagle3_top1_by_depth": [a / batches for a in agree], "eagle_top1": eagle1_agree / batches}

    summary = train(heads, loss_fn, t, work_dir / "state.pt", generator, on_eval, label="heads")
    export(heads, target, cfg, summary, aux_layer_ids)
    report = {**summary, "draft_vocab_coverage": coverage, "config": OmegaConf.to_container(cfg)}
    (work_dir / "report.json").write_text(json.dumps(report, indent=2))
    print(f"heads written to {resolve(cfg.out_dir.eagle)} and {resolve(cfg.out_dir.eagle3)}; "
          f"report in {work_dir / 'report.json'}")


if __name__ == "__main__":
    main()
