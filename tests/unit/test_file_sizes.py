"""Small files: no module under services/ is over 300 lines, none elsewhere over 400 (split by job instead)."""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 300


def test_no_service_module_is_over_300_lines():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
             for p in (ROOT / "services").rglob("*.py")}
    assert len(sizes) > 20
    long = {path: n for path, n in sorted(sizes.items()) if n > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines (split by job): {long}"


def test_no_module_of_the_project_is_over_400_lines():
    roots = ("dualpath", "shared", "services", "kernels", "deploy")
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
             for r in roots for p in (ROOT / r).rglob("*.py")}
    assert len(sizes) > 100
    long = {path: n for path, n in sorted(sizes.items()) if n > 400}
    assert not long, f"over 400 lines (split by job): {long}"
