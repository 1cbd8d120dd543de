"""No two classes of the project share a name (tests/ excluded): a name says which class it is.

An AST scan of every class statement under dualpath/, shared/, services/, kernels/ and deploy/,
nested ones too; a name found twice is listed with both paths.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("dualpath", "shared", "services", "kernels", "deploy")


def class_names(root: Path = ROOT) -> dict[str, list[str]]:
    """Class name -> every `path:line` that defines one of that name."""
    found: dict[str, list[str]] = defaultdict(list)
    for top in TOPS:
        for path in sorted((root / top).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    found[node.name].append(f"{path.relative_to(root).as_posix()}:{node.lineno}")
    return found


def test_the_scan_sees_the_project():
    names = class_names()
    assert len(names) > 300 and "Bus" in names and "BusEndpoint" in names


def test_no_two_classes_share_a_name():
    dup = {name: where for name, where in sorted(class_names().items()) if len(where) > 1}
    assert not dup, f"classes sharing a name (rename one so the name says which): {dup}"
