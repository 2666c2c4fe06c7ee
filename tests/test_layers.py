"""The import structure: every module the package installs has a layer in docs/architecture.md's table,
imports nothing from a layer above its own, and no chain of imports comes back to where it started.

The graph is read from the source (`ast`), with every import counted: at module level, inside
functions and under `TYPE_CHECKING` alike. Importing `a.b.c` from outside package `a.b` also runs the
`__init__` of `a` and `a.b`, so it counts as an import of those too.
"""

import ast
import re
from pathlib import Path

import pytest
import tomllib
from support.source_tree import CODE_FOLDERS, ROOT

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def installed_modules() -> dict[str, Path]:
    """{dotted name: source file} of every module pyproject.toml installs (a package's `__init__` under
    the package's own name)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dirs = setuptools["package-dir"]
    modules = {}
    for package in setuptools["packages"]:
        top, _, rest = package.partition(".")
        folder = ROOT / package_dirs.get(top, top) / rest.replace(".", "/")
        for source in folder.glob("*.py"):
            modules[package if source.stem == "__init__" else f"{package}.{source.stem}"] = source
    return modules


def layer_table() -> list[list[str]]:
    """The rows of the table after the `layers` marker: each layer's names, lowest layer first."""
    text = ARCHITECTURE.read_text()
    table = text[text.index("<!-- layers: read by tests/test_layers.py -->"):]
    rows = []
    for line in table.splitlines()[3:]:
        if not line.startswith("|"):
            break
        number, names = line.split("|")[1:3]
        assert int(number) == len(rows), f"layers must be numbered 0, 1, 2, ...: {line}"
        rows.append(["eyas" if n == "__init__" else f"eyas.{n}" for n in re.findall(r"`([\w.]+)`", names)])
    return rows


def layer_of(module: str, layers: list[list[str]]) -> int | None:
    """The layer of the longest name in the table that is `module` or a package holding it."""
    best = None
    for number, names in enumerate(layers):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (number, name)
    return None if best is None else best[0]


def imports_of(module: str, source: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that importing `module` runs directly."""
    is_package = source.stem == "__init__"
    package = module if is_package else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from package import module`
    found = set()
    for name in names:
        parts = name.split(".")
        for end in range(1, len(parts) + 1):  # the package `__init__`s on the way run too
            prefix = ".".join(parts[:end])
            if prefix in modules and prefix != module and not (module.startswith(prefix + ".") and end < len(parts)):
                found.add(prefix)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = installed_modules()
    return {module: imports_of(module, source, modules) for module, source in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), and modules importing themselves."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_the_graph_holds_every_source_module(graph):
    """Every `.py` under the code folders is in the graph (pyproject.toml lists its package)."""
    sources = {".".join(["eyas", *p.relative_to(ROOT).with_suffix("").parts]).removesuffix(".__init__")
               for top in CODE_FOLDERS for p in (ROOT / top).rglob("*.py")}
    assert sources | {"eyas", "eyas.__main__"} == set(graph)


def test_every_module_has_a_layer(graph):
    layers = layer_table()
    assert len(layers) >= 5 and layers[0] == ["eyas.kernels"]
    missing = sorted(m for m in graph if layer_of(m, layers) is None)
    assert not missing, f"modules with no layer in {ARCHITECTURE.name}'s table: {missing}"


def test_no_module_imports_from_a_layer_above_its_own(graph):
    layers = layer_table()
    upward = [f"{m} (layer {layer_of(m, layers)}) -> {t} (layer {layer_of(t, layers)})"
              for m, targets in sorted(graph.items()) for t in sorted(targets)
              if layer_of(t, layers) > layer_of(m, layers)]
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_no_import_circle(graph):
    assert circles(graph) == []


def test_the_runtime_never_imports_hydra_or_the_layers_above():
    outside = []
    for module, source in installed_modules().items():
        if module.startswith(("eyas.engine.", "eyas.containers.", "eyas.kernels.")):
            for node in ast.walk(ast.parse(source.read_text())):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                    outside += [f"{module} -> {n}" for n in names if n.split(".")[0] in ("hydra", "omegaconf")]
    assert not outside, outside


def test_the_checks_find_what_they_look_for(tmp_path):
    """A circle, an upward import and a module outside the table are each reported (the checks can fail)."""
    layers = [["eyas.kernels"], ["eyas.engine"], ["eyas.launch"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert layer_of("eyas.engine.models.llama", layers) == 1 and layer_of("eyas.containers.build", layers) is None
    assert layer_of("eyas.launch", [["eyas.launch.cli"], ["eyas.launch"]]) == 1
    modules = {"eyas.engine.a": Path("a.py"), "eyas.engine.b": Path("b.py"), "eyas.engine.pkg": Path("pkg/__init__.py"),
               "eyas.engine.pkg.c": Path("pkg/c.py")}
    source = tmp_path / "a.py"
    source.write_text("from eyas.engine.b import x\ndef f():\n    from .pkg import c\n")
    assert imports_of("eyas.engine.a", source, modules) == {"eyas.engine.b", "eyas.engine.pkg", "eyas.engine.pkg.c"}
