"""Train the target Llama on the standard-library corpus and export it as a Hugging Face directory.

    python scripts/train_target.py [train.steps=3000] [model.num_hidden_layers=12]

Resumable: rerunning continues from `work_dir/state.pt`. Prints train / valid / held-out loss and
writes them to `work_dir/report.json`.
"""

import json
import math

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from torch.nn import functional as F

from eyas.engine.attention.dense import dense_batch, dense_positions
from eyas.engine.models.config import ModelConfig
from eyas.engine.models.llama import LlamaForCausalLM
from eyas.engine.tokenizer import Tokenizer
from training.data import fixed_windows, random_windows, token_stream
from training.export import save_hf_dir
from training.loop import train
from training.paths import resolve
from training.setup import prepare


def build_config(cfg: DictConfig, vocab_size: int, eos_id: int, bos_id: int) -> ModelConfig:
    m = cfg.model
    return ModelConfig(
        vocab_size=vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_hidden_layers, num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_key_value_heads, head_dim=m.hidden_size // m.num_attention_heads,
        max_position_embeddings=m.max_position_embeddings, rms_norm_eps=m.rms_norm_eps, rope_theta=m.rope_theta,
        eos_token_ids=(eos_id,), bos_token_id=bos_id,
    )


def init_weights(model: torch.nn.Module, std: float, num_layers: int) -> None:
    for name, p in model.named_parameters():
        if p.dim() == 1:
            torch.nn.init.ones_(p) if name.endswith("norm.weight") else torch.nn.init.zeros_(p)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            torch.nn.init.normal_(p, std=std / math.sqrt(2 * num_layers))  # residual branches
        else:
            torch.nn.init.normal_(p, std=std)


def lm_loss(model, windows: torch.Tensor) -> torch.Tensor:
    b, t = windows.shape[0], windows.shape[1] - 1
    inputs, targets = windows[:, :-1].reshape(-1), windows[:, 1:].reshape(-1)
    hidden, _ = model(inputs, dense_positions(b, t, inputs.device), dense_batch(b, t))
    return F.cross_entropy(model.compute_logits(hidden), targets)


@torch.no_grad()
def eval_loss(model, windows: torch.Tensor, batch_size: int = 16) -> float:
    losses = [float(lm_loss(model, windows[i:i + batch_size])) for i in range(0, len(windows), batch_size)]
    return sum(losses) / len(losses)


def hf_config(config: ModelConfig) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers, "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim,
        "max_position_embeddings": config.max_position_embeddings, "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta, "hidden_act": "silu", "tie_word_embeddings": False,
        "attention_bias": False, "bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_ids[0],
        "torch_dtype": "float32",  # stored in half precision; computed in float32
    }


@hydra.main(config_path="conf", config_name="target", version_base="1.3")
def main(cfg: DictConfig) -> None:
    corpus_dir, tok_dir, work_dir = prepare(cfg)
    tok = Tokenizer.from_dir(tok_dir)
    config = build_config(cfg, tok.vocab_size, tok.eos_token_ids[0], tok._tok.token_to_id("<s>"))
    streams = {s: token_stream(corpus_dir, tok_dir, s, work_dir / "data") for s in ("train", "valid", "heldout")}
    print({s: len(v) for s, v in streams.items()}, "tokens")
    model = LlamaForCausalLM(config)
    init_weights(model, cfg.model.init_std, config.num_hidden_layers)
    print(f"target: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    evals = {s: fixed_windows(streams[s], cfg.train.seq_len, cfg.train.eval_windows) for s in ("valid", "heldout")}
    generator = torch.Generator().manual_seed(cfg.seed)
    t = cfg.train

    def loss_fn(gen):
        return lm_loss(model, random_windows(streams["train"], t.batch_size, t.seq_len, gen))

    def on_eval(step):
        model.eval()
        out = {"valid_loss": eval_loss(model, evals["valid"])}
        model.train()
        return out

    summary = train(model, loss_fn, t, work_dir / "state.pt", generator, on_eval, label="target")
    model.eval()
    report = {
        **summary, "parameters": sum(p.numel() for p in model.parameters()),
        "train_tokens": summary["steps"] * t.batch_size * t.seq_len,
        "valid_loss": eval_loss(model, evals["valid"]), "heldout_loss": eval_loss(model, evals["heldout"]),
        "config": OmegaConf.to_container(cfg),
    }
    (work_dir / "report.json").write_text(json.dumps(report, indent=2))
    out_dir = resolve(cfg.out_dir)
    save_hf_dir(out_dir, hf_config(config), model.state_dict(), getattr(torch, cfg.export_dtype), tok_dir)
    print(f"train loss {report['train_loss_ema']:.3f} | valid {report['valid_loss']:.3f} | "
          f"held-out {report['heldout_loss']:.3f} | {report['train_tokens'] / 1e6:.1f}M tokens in "
          f"{report['train_time_s'] / 60:.1f} min")
    print(f"target written to {out_dir}; report in {work_dir / 'report.json'}")


if __name__ == "__main__":
    main()
