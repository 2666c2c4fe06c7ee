"""Benchmark prompts drawn only from the standard-library files held out from training.

A prompt starts at a `def` or `class` line of a held-out file and runs for about `prompt_chars`
characters, cut at a line end. Prompts are taken round-robin over the files, so any count draws
from as many files as there are.
"""

import sysconfig
from pathlib import Path

from eyas.engine.assets import heldout_files

STARTS = ("def ", "class ", "    def ", "async def ")


def _starts(text: str) -> list[int]:
    lines = text.splitlines(keepends=True)
    offsets, pos = [], 0
    for line in lines:
        if line.startswith(STARTS):
            offsets.append(pos)
        pos += len(line)
    return offsets


def _cut(text: str, start: int, prompt_chars: int) -> str:
    end = text.find("\n", start + prompt_chars)
    return text[start:end + 1 if end >= 0 else len(text)]


def heldout_prompts(n: int, prompt_chars: int = 200) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    per_file = []
    for rel in heldout_files():
        path = root / rel
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            per_file.append([_cut(text, s, prompt_chars) for s in _starts(text)])
    return round_robin(per_file, n, "held-out")


def round_robin(per_file: list[list[str]], n: int, what: str) -> list[str]:
    """n prompts taken a file at a time: every file's first, then every file's second, ..."""
    prompts, depth = [], 0
    while len(prompts) < n and any(len(f) > depth for f in per_file):
        prompts.extend(f[depth] for f in per_file if len(f) > depth)
        depth += 1
    if len(prompts) < n:
        raise RuntimeError(f"only {len(prompts)} {what} prompts available, {n} asked")
    return prompts[:n]
