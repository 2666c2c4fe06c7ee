"""Resumable training state: model, optimizer, step and RNG in one file, written atomically."""

import os
from pathlib import Path

import torch


def save_state(path: Path, step: int, model, optimizer, generator: torch.Generator, extra: dict | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "generator": generator.get_state(), "extra": extra or {}}, tmp)
    os.replace(tmp, path)


def load_state(path: Path, model, optimizer, generator: torch.Generator) -> tuple[int, dict]:
    """Restore a saved state if there is one; return (step, extra); (0, {}) when starting fresh."""
    if not path.is_file():
        return 0, {}
    state = torch.load(path, weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["generator"])
    print(f"resumed from {path} at step {state['step']}")
    return state["step"], state["extra"]
