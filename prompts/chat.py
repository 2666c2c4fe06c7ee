"""Chat prompts built from text that ships with Python: the standard library's source and docstrings.

Each module's functions and classes give requests of several kinds (explain this code, write a function
from its docstring, summarise a docstring, show an example, answer a question about a module). Modules are
split by a hash of their name, so the held-out prompts come from modules the training prompts never saw.
"""

import ast
import hashlib
import random
import sys
import sysconfig
import textwrap
from pathlib import Path

MAX_SOURCE_LINES = 30
MAX_DOC_CHARS = 600


def stdlib_modules() -> list[tuple[str, Path]]:
    """(dotted name, file) for the standard library's .py files (tests and private modules left out)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    modules = []
    for file in sorted(root.rglob("*.py")):
        rel = file.relative_to(root)
        parts = rel.with_suffix("").parts
        if parts[0] in ("site-packages", "test", "idlelib", "lib2to3", "turtledemo", "tkinter", "ensurepip") or \
                any(p.startswith("_") and p != "__init__" for p in parts) or "tests" in parts:
            continue
        name = ".".join(p for p in parts if p != "__init__")
        modules.append((name, file))
    return modules


def split_of(module: str, heldout_percent: int) -> str:
    bucket = int(hashlib.sha256(module.encode()).hexdigest(), 16) % 100
    return "heldout" if bucket < heldout_percent else "train"


def _first_sentence(doc: str) -> str:
    para = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
    end = para.find(". ")
    return (para if end < 0 else para[:end + 1]).strip()


def _prompts_of(module: str, source: str, rng: random.Random, per_node: int) -> list[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    prompts = []
    module_doc = ast.get_docstring(tree)
    if module_doc and len(module_doc) > 80:
        prompts.append(rng.choice([
            f"What is the Python module `{module}` used for?",
            f"Summarize this documentation in a few sentences:\n\n{module_doc[:MAX_DOC_CHARS]}",
            f"Give me an overview of Python's `{module}` module with a short example.",
        ]))
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 40:
            continue
        snippet = textwrap.dedent("\n".join(lines[node.lineno - 1:node.end_lineno]))
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        sentence = _first_sentence(doc)
        choices = [
            f"What does the `{node.name}` {kind} in Python's `{module}` module do?",
            f"Write a Python {kind} named `{node.name}`. {sentence}",
            f"Explain this documentation to a beginner:\n\n{doc[:MAX_DOC_CHARS]}",
            f"Show how to use `{module}.{node.name}` in a short example.",
        ]
        if node.end_lineno - node.lineno < MAX_SOURCE_LINES:
            choices += [f"Explain what this Python code does:\n\n```python\n{snippet}\n```",
                        f"Review this Python {kind} and suggest improvements:\n\n```python\n{snippet}\n```",
                        f"Write unit tests for this Python {kind}:\n\n```python\n{snippet}\n```"]
        prompts.extend(rng.sample(choices, per_node))
    return prompts


def build_prompts(heldout_percent: int = 10, seed: int = 0, per_node: int = 2) -> dict[str, list[str]]:
    """{"train": [...], "heldout": [...]}: one user message per entry (`per_node` kinds of request per
    documented function or class), shuffled."""
    rng = random.Random(seed)
    splits = {"train": [], "heldout": []}
    for module, file in stdlib_modules():
        try:
            source = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        splits[split_of(module, heldout_percent)].extend(_prompts_of(module, source, rng, per_node))
    for prompts in splits.values():
        rng.shuffle(prompts)
    return splits


if __name__ == "__main__":
    splits = build_prompts()
    print({k: len(v) for k, v in splits.items()}, sys.version.split()[0])
    for p in splits["heldout"][:5]:
        print("---\n" + p[:300])
