"""The models shipped inside the package (trained by scripts/ on the standard library's sources)."""

from pathlib import Path

from engine.errors import ConfigError

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
SHIPPED = ("target", "eagle", "eagle3", "draft_lm")


def asset_path(name: str) -> str:
    """Directory of a shipped model: target (the code LM), eagle, eagle3 (its heads), draft_lm."""
    if name not in SHIPPED:
        raise ConfigError(f"unknown shipped model {name!r}; allowed: {list(SHIPPED)}")
    return str(ASSETS_DIR / name)


def heldout_files() -> list[str]:
    """Standard-library paths (relative to the stdlib root) held out from training: benchmark prompts."""
    return (ASSETS_DIR / "heldout_files.txt").read_text().split()
