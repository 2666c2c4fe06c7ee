"""Mutation testing: change one operator, constant or statement of the engine at a time and check that
the tests fail.

    python scripts/mutation_run.py                        # the default files, the tests mapped to each
    python scripts/mutation_run.py engine/stopping.py --list
    python scripts/mutation_run.py --jobs 2 --json mutation_report.json   # 2 runs at a time, 1 thread each

Mutants: comparison flips (== / !=, < / <=, > / >=, is / is not, in / not in), arithmetic and bitwise
operator swaps, and / or, a dropped `not` or unary minus, integer and float constants + 1, booleans
flipped, and a call or augmented assignment statement replaced by `pass`. Each mutant is written into
a copy of the repository (the module re-rendered with `ast.unparse`), the tests mapped to its file run
with `-x` there, and the mutant counts as killed when they fail or time out. The unmutated module,
re-rendered the same way, must pass first. Session fixtures are cached across the runs
(`EYAS_TEST_CACHE_DIR`), built once from the unmutated code. With `--jobs N`, N copies run side by
side, each with OMP_NUM_THREADS = cores / N.
"""

import argparse
import ast
import copy
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SAMPLING_TESTS = ["tests/engine/test_keyed_random.py", "tests/engine/test_sampling.py",
                  "tests/e2e/test_reproducible_sampling.py", "tests/e2e/test_spec_sampling.py",
                  "tests/engine/test_engine_limits.py"]
SPEC_TESTS = ["tests/engine/speculative/test_spec_bookkeeping.py", "tests/engine/speculative/test_spec_contract.py",
              "tests/e2e/test_spec_lossless.py", "tests/e2e/test_reproducible_sampling.py",
              "tests/engine/test_engine_limits.py", "tests/e2e/test_adaptive_lossless.py",
              "tests/engine/speculative/test_adaptive_scope.py", "tests/e2e/test_spec_sampling.py",
              "tests/engine/speculative/test_rejection_verify.py", "tests/e2e/test_shipped.py"]
ADAPTIVE_TESTS = ["tests/engine/speculative/test_adaptive_policies.py", "tests/e2e/test_adaptive_lossless.py",
                  "tests/engine/speculative/test_adaptive_scope.py", "tests/e2e/test_reproducible_sampling.py",
                  "tests/engine/speculative/test_rejection_verify.py"]
# file (or folder prefix) -> the tests that should catch its mutants, fastest first
TESTS_FOR = {
    "engine/sampling.py": SAMPLING_TESTS,
    "engine/keyed_random.py": SAMPLING_TESTS,
    "engine/speculative/rejection.py": ["tests/e2e/test_spec_sampling.py",
                                        "tests/engine/speculative/test_rejection_verify.py"],
    "engine/stopping.py": ["tests/engine/test_stopping.py", "tests/engine/test_engine_limits.py",
                           "tests/e2e/test_spec_lossless.py"],
    "engine/speculative/adaptive/": ADAPTIVE_TESTS,
    "engine/speculative/drafters/": [*SPEC_TESTS, "tests/e2e/test_spec_ngram.py", "tests/e2e/test_spec_standalone.py",
                                     "tests/e2e/test_spec_trees.py"],
    "engine/speculative/": SPEC_TESTS,
}
DEFAULT_FILES = ["engine/sampling.py", "engine/keyed_random.py", "engine/stopping.py",
                 *sorted(str(p.relative_to(REPO)) for folder in ("", "/drafters", "/adaptive")
                         for p in (REPO / f"engine/speculative{folder}").glob("*.py") if p.name != "__init__.py")]

COMPARE_SWAPS = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE,
                 ast.GtE: ast.Gt, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
BINOP_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
               ast.Mod: ast.FloorDiv, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitOr,
               ast.LShift: ast.RShift, ast.RShift: ast.LShift, ast.Pow: ast.Mult}


def tests_for(path: str) -> list[str]:
    for prefix, tests in TESTS_FOR.items():
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return tests
    raise SystemExit(f"no tests are mapped to {path}: add it to TESTS_FOR")


def _skipped(tree: ast.AST) -> set[int]:
    """ids of nodes never mutated: docstrings, annotations, f-string parts."""
    skip = set()

    def mark(node):
        for sub in ast.walk(node):
            skip.add(id(sub))

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            mark(body[0])
        if isinstance(node, (ast.AnnAssign, ast.arg)) and node.annotation is not None:
            mark(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            mark(node.returns)
        if isinstance(node, ast.JoinedStr):
            mark(node)
    return skip


def mutation_sites(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """(node, kind) for every mutation of the module, in a stable order."""
    skip = _skipped(tree)
    sites = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            sites += [(node, f"compare:{i}") for i, op in enumerate(node.ops) if type(op) in COMPARE_SWAPS]
        elif isinstance(node, ast.BinOp) and type(node.op) in BINOP_SWAPS:
            sites.append((node, "binop"))
        elif isinstance(node, ast.AugAssign):
            if type(node.op) in BINOP_SWAPS:
                sites.append((node, "binop"))
            sites.append((node, "drop"))
        elif isinstance(node, ast.BoolOp):
            sites.append((node, "boolop"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            sites.append((node, "unary"))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
            sites.append((node, "constant"))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            sites.append((node, "drop"))
    return sites


class _Apply(ast.NodeTransformer):
    def __init__(self, target: ast.AST, kind: str):
        self.target, self.kind = target, kind

    def visit(self, node):
        if node is not self.target:
            return self.generic_visit(node)
        kind = self.kind
        if kind.startswith("compare:"):
            i = int(kind.split(":")[1])
            node.ops[i] = COMPARE_SWAPS[type(node.ops[i])]()
        elif kind == "binop":
            node.op = BINOP_SWAPS[type(node.op)]()
        elif kind == "boolop":
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        elif kind == "unary":
            return node.operand
        elif kind == "constant":
            node.value = (not node.value) if isinstance(node.value, bool) else node.value + 1
        elif kind == "drop":
            return ast.Pass()
        return node


def mutant_source(source: str, index: int) -> tuple[str, int, str, str]:
    """The module with mutation `index` applied: (source, line, original code, mutated code)."""
    tree = ast.parse(source)
    node, kind = mutation_sites(tree)[index]
    before = ast.unparse(node)
    line = node.lineno
    shadow = copy.deepcopy(node)
    mutated = _Apply(node, kind).visit(tree)
    after = ast.unparse(_Apply(shadow, kind).visit(shadow)) if kind != "drop" else "pass"
    return ast.unparse(ast.fix_missing_locations(mutated)), line, before, after


def run_tests(work: Path, tests: list[str], timeout: int, env: dict) -> str:
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    return "passed" if proc.returncode == 0 else "failed"


def copy_repo(dest: Path) -> Path:
    """A copy of the repository in a folder named `eyas`: its parent first on PYTHONPATH makes the copy the
    package the tests import (the root is the package `eyas`)."""
    ignore = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "outputs", "multirun", "runs",
                                    "bench_out", ".pytest_cache")
    shutil.copytree(REPO, dest, ignore=ignore)
    return dest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", default=DEFAULT_FILES, help="repository-relative modules to mutate")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("--timeout", type=int, default=900, help="seconds per test run before the mutant counts as killed")
    p.add_argument("--json", type=Path, default=None, help="write every mutant's outcome here")
    p.add_argument("--jobs", type=int, default=1, help="mutants tested side by side")
    p.add_argument("--only", type=Path, default=None,
                   help="a --json report: test again only the mutants that survived in it")
    args = p.parse_args()

    plan = []
    for path in args.files:
        source = (REPO / path).read_text()
        for index in range(len(mutation_sites(ast.parse(source)))):
            plan.append((path, index))
    if args.only:
        survived = {(r["file"], r["index"]) for r in json.loads(args.only.read_text()) if r["status"] == "survived"}
        plan = [item for item in plan if item in survived]
    print(f"{len(plan)} mutants in {len(args.files)} files", flush=True)
    if args.list:
        for path, index in plan:
            _, line, before, after = mutant_source((REPO / path).read_text(), index)
            print(f"{path}:{line}: {before!r} -> {after!r}")
        return

    results = []
    jobs = max(1, args.jobs)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "EYAS_TEST_CACHE_DIR": str(Path(tmp) / "fixtures"), "PYTHONDONTWRITEBYTECODE": "1"}
        works = [copy_repo(Path(tmp) / f"job{j}" / "eyas") for j in range(jobs)]
        for work in works:
            for path in args.files:  # the re-rendered, unmutated modules must pass
                (work / path).write_text(ast.unparse(ast.parse((REPO / path).read_text())))
        baseline = run_tests(works[0], sorted({t for f in args.files for t in tests_for(f)}), args.timeout * 3,
                             {**env, "PYTHONPATH": str(works[0].parent)})
        if baseline != "passed":
            raise SystemExit(f"the unmutated code does not pass its tests ({baseline}): fix that first")
        todo: queue.Queue = queue.Queue()
        for item in plan:
            todo.put(item)
        lock = threading.Lock()
        threads = str(max(1, (os.cpu_count() or 1) // jobs))

        def worker(work: Path) -> None:
            job_env = {**env, "PYTHONPATH": str(work.parent), "OMP_NUM_THREADS": threads}
            while True:
                try:
                    path, index = todo.get_nowait()
                except queue.Empty:
                    return
                original = (REPO / path).read_text()
                source, line, before, after = mutant_source(original, index)
                (work / path).write_text(source)
                start = time.perf_counter()
                outcome = run_tests(work, tests_for(path), args.timeout, job_env)
                (work / path).write_text(ast.unparse(ast.parse(original)))
                status = "survived" if outcome == "passed" else "killed"
                with lock:
                    results.append({"file": path, "index": index, "line": line, "before": before, "after": after,
                                    "status": status, "outcome": outcome,
                                    "seconds": round(time.perf_counter() - start, 1)})
                    print(f"[{len(results)}/{len(plan)}] {status:8s} {path}:{line}: {before!r} -> {after!r}",
                          flush=True)
                    if args.json:
                        args.json.write_text(json.dumps(results, indent=1))

        pool = [threading.Thread(target=worker, args=(work,)) for work in works]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    killed = sum(r["status"] == "killed" for r in results)
    print(f"\n{killed} of {len(results)} mutants killed, {len(results) - killed} survived")
    for path in args.files:
        rows = [r for r in results if r["file"] == path]
        print(f"  {path}: {sum(r['status'] == 'killed' for r in rows)}/{len(rows)} killed")
    results.sort(key=lambda r: (args.files.index(r["file"]), r["index"]))
    for r in results:
        if r["status"] == "survived":
            print(f"  survived {r['file']}:{r['line']}: {r['before']!r} -> {r['after']!r}")


if __name__ == "__main__":
    main()
