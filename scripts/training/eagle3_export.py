"""Write a trained EAGLE-3 head in the published layout (config.json + model.safetensors with d2t / t2d)."""

from pathlib import Path

import torch

from training.export import save_hf_dir


def export_eagle3(head, target_config, out_dir: Path, dtype: torch.dtype) -> None:
    tc = target_config
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": tc.hidden_size,
        "intermediate_size": tc.intermediate_size, "num_attention_heads": tc.num_attention_heads,
        "num_key_value_heads": tc.num_key_value_heads, "head_dim": tc.head_dim, "num_hidden_layers": 1,
        "vocab_size": tc.vocab_size, "draft_vocab_size": head.draft_vocab_size,
        "target_hidden_size": tc.hidden_size, "max_position_embeddings": tc.max_position_embeddings,
        "rms_norm_eps": tc.rms_norm_eps, "rope_theta": tc.rope_theta, "hidden_act": "silu",
        "tie_word_embeddings": False, "torch_dtype": str(dtype).removeprefix("torch."),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(head.aux_layer_ids)},
    }
    state = {k: v for k, v in head.state_dict().items() if k.startswith(("fc.", "midlayer.", "norm.", "lm_head."))}
    save_hf_dir(out_dir, config, state, dtype)
    from safetensors.torch import load_file, save_file  # d2t / t2d keep their integer / bool dtypes

    path = out_dir / "model.safetensors"
    tensors = load_file(str(path))
    tensors["d2t"], tensors["t2d"] = head.d2t.clone(), head.t2d.clone()
    save_file(tensors, str(path), metadata={"format": "pt"})
