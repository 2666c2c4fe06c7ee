"""Benchmark workloads: prompts none of the shipped models trained on, by kind of text.

- `stdlib`: held-out standard-library files (`heldout.py`), a `def` / `class` line and ~200 characters.
- `package`: the source of third-party packages every install of eyas brings (`PACKAGES`), cut the
  same way: code of another style than the training corpus's.
- `docstring`: a function's signature and docstring from those packages, cut where the docstring
  closes: the model writes the body.
- `prose`: English prose (`prompts/natural_language.txt`), text the shipped model drafts worst.
- `chat`: user messages built from standard-library modules that `eyas.prompts.chat` holds out
  of the chat models' distillation data (explain, write, review this code...), to be rendered with the
  model's chat template (`chat_prompts_for`).
- `repeated`: the requests repeat earlier ones' content, as an agent re-planning or a file edited
  again does: `package` prompts, each followed by `REPEATS` copies with a small edit (a renamed
  identifier, a comment line above), in that order. A drafter that remembers what earlier requests
  wrote can draft the later ones' outputs; one that sees only the request's own tokens cannot.

Files are walked in sorted order and prompts taken round-robin over them, so a count draws from as
many files as there are and the same installed versions give the same prompts.
"""

import ast
import importlib.util
import re
from pathlib import Path

from eyas.prompts.heldout import STARTS, _cut, _starts, heldout_prompts, round_robin
from eyas.prompts.prose import prose_lines

PACKAGES = ("omegaconf", "hydra", "_pytest", "pluggy", "yaml", "antlr4")  # installed with eyas's core and tests
WORKLOADS = ("stdlib", "package", "docstring", "prose", "repeated")
CHAT_WORKLOADS = ("chat",)  # user messages: the script renders them with the model's chat template
REPEATS = 2  # edited copies after each original in `repeated`


def _package_files() -> list[Path]:
    files = []
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            root = Path(list(spec.submodule_search_locations)[0])
            files += sorted(p for p in root.rglob("*.py") if p.stat().st_size > 2000)
    if not files:
        raise RuntimeError(f"none of the packages {PACKAGES} is installed")
    return files


def package_prompts(n: int, prompt_chars: int = 200) -> list[str]:
    per_file = []
    for path in _package_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        per_file.append([_cut(text, s, prompt_chars) for s in _starts(text)])
    return round_robin(per_file, n, "package")


def _docstring_cuts(text: str) -> list[str]:
    """Each function's source from its `def` line to the line closing its docstring."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    lines = text.splitlines(keepends=True)
    cuts = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node) and node.body:
            doc = node.body[0]
            start = node.lineno - 1 if not node.decorator_list else node.decorator_list[0].lineno - 1
            if lines[start].lstrip().startswith(tuple(s.strip() for s in STARTS) + ("@",)) and len(node.body) > 1:
                cuts.append((node.lineno, "".join(lines[start:doc.end_lineno])))
    return [c for _, c in sorted(cuts) if 40 < len(c) < 1200]


def docstring_prompts(n: int) -> list[str]:
    per_file = [_docstring_cuts(p.read_text(encoding="utf-8", errors="replace")) for p in _package_files()]
    return round_robin(per_file, n, "docstring")


def prose_prompts(n: int) -> list[str]:
    lines = prose_lines()
    if len(lines) < n:
        raise RuntimeError(f"only {len(lines)} prose prompts available, {n} asked")
    return lines[:n]


def _edits(prompt: str) -> list[str]:
    """`REPEATS` small edits of a prompt: the first defined name renamed, then a comment line above."""
    renamed = re.sub(r"\b(def|class)\s+(\w+)", lambda m: f"{m.group(1)} {m.group(2)}_v2", prompt, count=1)
    return [renamed, "# revised\n" + prompt][:REPEATS]


def repeated_prompts(n: int, prompt_chars: int = 200) -> list[str]:
    originals = package_prompts(-(-n // (REPEATS + 1)), prompt_chars)
    return [p for original in originals for p in [original, *_edits(original)]][:n]


def chat_messages(n: int) -> list[str]:
    from eyas.prompts.chat import build_prompts

    return build_prompts()["heldout"][:n]


def chat_prompts_for(messages: list[str], overrides: list[str]) -> list[str]:
    """Each message rendered as a user turn with the chat template of the model `overrides` configure."""
    from eyas.bench.target import compose_config
    from eyas.engine.chat_template import model_chat_template
    from eyas.engine.models.checkpoint_source import checkpoint_directory

    path = compose_config(list(overrides))["model"]["path"]
    template = model_chat_template(checkpoint_directory(path))
    if template is None:
        raise SystemExit(f"the chat workload needs a model with a chat template; model.path={path} has none")
    return [template.render([("user", m)]) for m in messages]


def workload_prompts(name: str, n: int) -> list[str]:
    makers = {"stdlib": heldout_prompts, "package": package_prompts, "docstring": docstring_prompts,
              "prose": prose_prompts, "repeated": repeated_prompts, "chat": chat_messages}
    if name not in makers:
        raise ValueError(f"unknown workload {name!r}; allowed: {', '.join(WORKLOADS + CHAT_WORKLOADS)}")
    return makers[name](n)


QUESTIONS = ("What does `{name}` do?", "Show a short example that calls `{module}.{name}`.",
             "When would I use `{name}` rather than writing it myself?", "What arguments does `{name}` take?")


def shared_system_prompts(num_prefixes: int, per_prefix: int, skip: int = 0,
                          doc_chars: int = 1600) -> list[list[dict]]:
    """`num_prefixes` x `per_prefix` chat conversations: each a system prompt about one standard library
    module (those the chat heads' distillation held out first, then others: what is compared here is routing,
    and every router sees the same prompts) (its docstring and its public names' docstrings, `doc_chars` characters: the shared prefix) and a question about
    one of its functions or classes, never the same question twice. `skip` prefixes are passed over (a
    second set of the same size is disjoint from the first). Prefixes go round-robin: requests of one
    prefix are spread through the list, as concurrent users of a few system prompts send them."""
    from eyas.prompts.chat import split_of, stdlib_modules

    groups = []
    modules = sorted(stdlib_modules(), key=lambda m: split_of(m[0], 10) != "heldout")  # held-out ones first
    for module, file in modules:
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        documented = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                      and not n.name.startswith("_") and ast.get_docstring(n)]
        names = sorted({n.name for n in documented})
        questions = [q.format(name=name, module=module) for name in names for q in QUESTIONS]
        doc = "\n\n".join([ast.get_docstring(tree) or "", *(f"{n.name}: {ast.get_docstring(n)}" for n in documented)])
        if len(doc.strip()) < doc_chars or len(questions) < per_prefix:
            continue
        system = f"You answer questions about Python's `{module}` module. Its documentation:\n\n{doc[:doc_chars]}"
        groups.append([[{"role": "system", "content": system}, {"role": "user", "content": q}]
                       for q in questions[:per_prefix]])
    groups = groups[skip:skip + num_prefixes]
    if len(groups) < num_prefixes:
        raise RuntimeError(f"only {len(groups)} modules with {per_prefix} questions available past {skip}")
    return [group[i] for i in range(per_prefix) for group in groups]
