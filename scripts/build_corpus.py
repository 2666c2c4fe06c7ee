"""Build the training corpus from the standard library's `.py` files: train / valid / held-out splits.

    python scripts/build_corpus.py [out_dir=runs/corpus]

Each split is a JSON list of {"path", "text"}; `heldout_files.txt` lists the held-out paths
(benchmarks draw their prompts only from them). The split of a file depends only on its path.
"""

import hashlib
import json
import sysconfig
from pathlib import Path

import hydra
from omegaconf import DictConfig

from training.paths import resolve


def split_of(relative_path: str, split: dict) -> str:
    bucket = int(hashlib.sha1(relative_path.encode()).hexdigest(), 16) % 100
    if bucket < split["train"]:
        return "train"
    return "valid" if bucket < split["train"] + split["valid"] else "heldout"


def stdlib_files(exclude_dirs: list[str]) -> tuple[Path, list[Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py")
        if not set(p.relative_to(root).parts[:-1]) & set(exclude_dirs) and not p.name.startswith("test_")
    )
    return root, files


@hydra.main(config_path="conf", config_name="corpus", version_base="1.3")
def main(cfg: DictConfig) -> None:
    out_dir = resolve(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    root, files = stdlib_files(list(cfg.exclude_dirs))
    splits = {"train": [], "valid": [], "heldout": []}
    for path in files:
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            splits[split_of(rel, cfg.split)].append({"path": rel, "text": text})
    for name, docs in splits.items():
        (out_dir / f"{name}.json").write_text(json.dumps(docs))
        print(f"{name}: {len(docs)} files, {sum(len(d['text']) for d in docs) / 1e6:.2f} MB")
    (out_dir / "heldout_files.txt").write_text("\n".join(d["path"] for d in splits["heldout"]) + "\n")
    print(f"corpus written to {out_dir} (from {root})")


if __name__ == "__main__":
    main()
