"""The package's layers: no import cycle, and no module imports a layer above its own.

The layers are read from docs/ARCHITECTURE.md ("Layers": one line per layer, the top first, its
folders and root modules), so the picture there and this test cannot disagree. An import is
any `import` the module runs: at its top or inside a function. A hint under `if
TYPE_CHECKING:` is no import at run time and may point anywhere (a lever's terms name the
Layout and CostParams that they are applied to).
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "autotune"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"


def layers() -> list[tuple[str, ...]]:
    """docs/ARCHITECTURE.md's layers, the ground first: each a tuple of names such as
    `search` (a folder) or `errors` (a root module)."""
    text = ARCHITECTURE.read_text()
    block = re.search(r"^## Layers\n.*?^```\n(.*?)^```", text, re.M | re.S)
    assert block, "docs/ARCHITECTURE.md has no ## Layers section with a ``` block"
    out = []
    for line in block.group(1).splitlines():
        names = []
        for word in line.split():
            if not word.endswith(("/", ".py")):
                break
            names.append(word.removesuffix("/").removesuffix(".py"))
        if names:
            out.append(tuple(names))
    return out[::-1]


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(module imported, line) for each autotune import `name` runs, hints left out."""
    tree = ast.parse(path.read_text())
    hints: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hints |= {id(n) for child in node.body for n in ast.walk(child)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in hints:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("autotune") and target != name:
                yield target, node.lineno


MODULES = modules()
GRAPH = {name: sorted(set(imports(name, path, MODULES))) for name, path in MODULES.items()}
GRAPH_PATHS = {name: str(path.relative_to(ROOT)) for name, path in MODULES.items()}


def layer_of(name: str) -> str:
    """`autotune.search.loop` -> search; `autotune.errors` -> errors; `autotune` -> autotune."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "autotune"


def rank() -> dict[str, int]:
    ranks = {"autotune": 0}  # the package's face: its version, nothing else
    for i, names in enumerate(layers()):
        for layer in names:
            ranks[layer] = i
    return ranks


def test_every_folder_and_root_module_has_a_layer() -> None:
    ranks = rank()
    missing = sorted({layer_of(m) for m in GRAPH} - set(ranks))
    assert not missing, (f"not in docs/ARCHITECTURE.md's ## Layers: {', '.join(missing)} "
                         "(give each folder or root module its line)")
    stale = sorted(set(ranks) - {layer_of(m) for m in GRAPH})
    assert not stale, f"## Layers names what the package does not have: {', '.join(stale)}"


def test_no_module_imports_a_layer_above_its_own() -> None:
    ranks = rank()
    upward = [f"{GRAPH_PATHS[a]}:{line} imports {b} ({layer_of(b)} is above {layer_of(a)})"
              for a, targets in GRAPH.items() for b, line in targets
              if ranks[layer_of(b)] > ranks[layer_of(a)]]
    assert not upward, "\n".join(upward)


def test_nothing_outside_the_worker_imports_it() -> None:
    """The worker is another process (`python -m autotune.worker` under torchrun): the
    orchestrator talks to it through files (autotune.trials.protocol), never by importing it,
    which keeps torch out of `autotune --help` and the simulate backend."""
    inward = [f"{GRAPH_PATHS[a]}:{line} imports {b}" for a, targets in GRAPH.items()
              for b, line in targets
              if layer_of(b) == "worker" and layer_of(a) != "worker"]
    assert not inward, "\n".join(inward)


def test_every_package_is_installed() -> None:
    """pyproject.toml lists the packages setuptools installs: a folder left out is missing from
    an installed autotune (only a checkout on PYTHONPATH would still import it)."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")}
    assert not folders - listed, f"not in pyproject.toml's packages: {sorted(folders - listed)}"


def cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle() -> None:
    graph = {a: [b for b, _ in targets] for a, targets in GRAPH.items()}
    assert not cycles(graph), "modules that import each other in a loop: " + "; ".join(
        " <-> ".join(c) for c in cycles(graph))


@pytest.mark.parametrize(("graph", "expected"), [
    ({"a": ["b"], "b": ["c"], "c": []}, []),
    ({"a": ["b"], "b": ["a"]}, [["a", "b"]]),
    ({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}, [["a", "b", "c"]]),
])
def test_cycles_finds_loops(graph: dict[str, list[str]], expected: list[list[str]]) -> None:
    assert cycles(graph) == expected


def test_a_hint_is_no_import_but_a_lazy_import_is(tmp_path: Path) -> None:
    path = tmp_path / "probe.py"
    path.write_text("from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    from autotune.search.loop import Search\n"
                    "def f():\n    from autotune.report.load import load_study\n")
    assert [t for t, _ in imports("autotune.errors", path, MODULES)] == ["autotune.report.load"]

