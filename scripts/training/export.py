"""Write trained weights in Hugging Face layouts (config.json + model.safetensors)."""

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file


def save_hf_dir(out_dir: Path, config: dict, state: dict[str, torch.Tensor], dtype: torch.dtype,
                tokenizer_dir: Path | None = None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in state.items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    if tokenizer_dir is not None:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tokenizer_dir / name, out_dir / name)
