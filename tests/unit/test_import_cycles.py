"""No two modules of the project import each other, directly or through others.

Walks the static import graph of services/, shared/, dualpath/ and kernels/ from the
source (AST, no imports run): `import a.b`, `from a import b` (an edge to `a.b` when that
is a module, else to `a`), relative imports, and imports inside functions or under
`if TYPE_CHECKING:` alike. Every strongly connected component of more than one module is
a cycle; the test lists them all.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("services", "shared", "dualpath", "kernels")


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the top packages."""
    out: dict[str, Path] = {}
    for top in TOPS:
        for path in (root / top).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _targets(node: ast.Import | ast.ImportFrom, here: str, is_pkg: bool, known: set[str]) -> list[str]:
    """The project modules one import statement in module `here` depends on."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
        return [_known_prefix(n, known) for n in names if _known_prefix(n, known)]
    base = node.module or ""
    if node.level:
        package = here.split(".") if is_pkg else here.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}" if base else alias.name
        target = sub if sub in known else _known_prefix(base, known)
        if target:
            out.append(target)
    return out


def _known_prefix(name: str, known: set[str]) -> str | None:
    """`name` or its longest dotted prefix that is a project module."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in known:
            return ".".join(parts)
        parts.pop()
    return None


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (self-imports dropped)."""
    known = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_pkg = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_targets(node, name, is_pkg, known))
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


# --- the walker itself -------------------------------------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return module_files(tmp_path)


def test_walker_sees_every_import_form(tmp_path):
    files = _tree(tmp_path, {
        "shared/__init__.py": "",
        "shared/pkg/__init__.py": "from . import sub\n",
        "shared/pkg/sub.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..other import X\n",
        "shared/other.py": "def f():\n    import shared.pkg.deep\n",
        "shared/pkg/deep.py": "from shared.pkg import sub as s, NAME\n",
    })
    graph = import_graph(files)
    assert graph["shared.pkg"] == {"shared.pkg.sub"}  # relative `from . import <submodule>`
    assert graph["shared.pkg.sub"] == {"shared.other"}  # TYPE_CHECKING, two dots
    assert graph["shared.other"] == {"shared.pkg.deep"}  # inside a function
    assert graph["shared.pkg.deep"] == {"shared.pkg.sub", "shared.pkg"}  # submodule and a name
    assert cycles(graph) == [["shared.other", "shared.pkg", "shared.pkg.deep", "shared.pkg.sub"]]


def test_tarjan_separates_components_and_ignores_chains():
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": set(), "e": {"f"}, "f": {"g"}, "g": {"e"}}
    assert cycles(graph) == [["a", "b"], ["e", "f", "g"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


# --- the project -------------------------------------------------------------------------------

def test_no_import_cycle_between_project_modules():
    files = module_files()
    assert len(files) > 50
    found = cycles(import_graph(files))
    listing = "\n".join(" <-> ".join(c) for c in found)
    assert not found, f"import cycles (each line one strongly connected component):\n{listing}"
