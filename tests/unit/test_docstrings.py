"""Docstrings say what a module owns, not its history: short module docstrings, a small share of the code."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("services", "shared", "dualpath", "kernels", "deploy")
MODULE_LINES = 6
SHARE = 0.08
_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def docstring_node(node: ast.AST) -> ast.Expr | None:
    body = getattr(node, "body", None)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[0]
    return None


def measure(path: Path) -> tuple[int, int, int]:
    """(non-blank lines, non-blank docstring lines, physical lines of the module docstring)."""
    src = path.read_text()
    lines = src.splitlines()
    tree = ast.parse(src)
    doc = 0
    for node in ast.walk(tree):
        if isinstance(node, _OWNERS) and (expr := docstring_node(node)):
            doc += sum(1 for line in lines[expr.lineno - 1:expr.end_lineno] if line.strip())
    head = docstring_node(tree)
    module = head.end_lineno - head.lineno + 1 if head else 0
    return sum(1 for line in lines if line.strip()), doc, module


def sources() -> list[Path]:
    return sorted(p for top in TOPS for p in (ROOT / top).rglob("*.py"))


def test_module_docstrings_are_at_most_six_lines():
    long = [f"{p.relative_to(ROOT)}: {m} lines" for p in sources() if (m := measure(p)[2]) > MODULE_LINES]
    assert not long, "module docstrings over 6 lines:\n" + "\n".join(long)


def test_docstrings_are_at_most_eight_percent_of_the_code():
    code = doc = 0
    for p in sources():
        c, d, _ = measure(p)
        code, doc = code + c, doc + d
    assert doc / code <= SHARE, f"docstrings are {doc} of {code} code lines ({doc / code:.1%})"


def test_the_measure_counts_every_kind_of_docstring(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""One.\n\nTwo.\n"""\n\nclass A:\n    """a"""\n\n    def f(self):\n        """b\n        c"""\n'
                 '        return 1\n\nasync def g():\n    """d"""\n')
    assert measure(f) == (11, 7, 4)
