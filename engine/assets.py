"""The models shipped inside the package (trained by scripts/ on the standard library's sources)."""

from pathlib import Path

from eyas.engine.errors import ConfigError

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
# name -> path under assets/
SHIPPED = {"target": "target", "eagle": "eagle", "eagle3": "eagle3", "draft_lm": "draft_lm", "prompts": "prompts.txt",
           "smollm2_eagle3": "smollm2-eagle3"}


def asset_path(name: str) -> str:
    """Path of a shipped asset: target (the code LM), eagle, eagle3 (its heads), draft_lm (directories),
    smollm2_eagle3 (the EAGLE-3 head of SmolLM2-135M-Instruct);
    prompts (a file of code prompts, one per line, that the tuning experiment runs by default)."""
    if name not in SHIPPED:
        raise ConfigError(f"unknown shipped asset {name!r}; allowed: {list(SHIPPED)}")
    return str(ASSETS_DIR / SHIPPED[name])


def heldout_files() -> list[str]:
    """Standard-library paths (relative to the stdlib root) held out from training: benchmark prompts."""
    return (ASSETS_DIR / "heldout_files.txt").read_text().split()
