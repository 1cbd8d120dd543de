"""docs/structures.md lists every module of the project (one line each: what it owns)."""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_every_module_is_listed_once():
    doc = (ROOT / "docs" / "structures.md").read_text()
    modules = [p.relative_to(ROOT).as_posix() for top in ("services", "shared", "dualpath", "kernels")
               for p in (ROOT / top).rglob("*.py")]
    assert modules
    missing = [m for m in modules if f"`{m}`" not in doc]
    assert not missing, f"add to docs/structures.md: {missing}"
    listed = [line.split("`")[1] for line in doc.splitlines() if line.startswith("- `")]
    stale = [m for m in listed if not (ROOT / m).exists()]
    assert not stale, f"remove from docs/structures.md: {stale}"
