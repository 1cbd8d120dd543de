"""`make test` runs the fast tiers first (tests/conftest.py): unit, model, unmarked, integration,
gpu; each module whole, at its slowest test's tier; otherwise in collection order."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import ordered

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class _Mark:
    name: str


@dataclass
class _Item:
    nodeid: str
    marks: list[str] = field(default_factory=list)

    def iter_markers(self):
        return [_Mark(m) for m in self.marks]


def _ids(items) -> list[str]:
    return [i.nodeid for i in items]


def test_tiers_run_fastest_first_and_keep_collection_order_within_one():
    items = [_Item("g.py::a", ["gpu", "integration"]), _Item("i.py::a", ["integration", "slow"]),
             _Item("m.py::a", ["model"]), _Item("u1.py::a", ["unit"]), _Item("n.py::a"),
             _Item("u2.py::a", ["unit"]), _Item("u2.py::b", ["unit"])]
    assert _ids(ordered(items)) == ["u1.py::a", "u2.py::a", "u2.py::b", "m.py::a", "n.py::a", "i.py::a", "g.py::a"]


def test_a_module_stays_whole_at_its_slowest_tests_tier():
    items = [_Item("x.py::fast", ["unit"]), _Item("x.py::slow", ["integration"]), _Item("y.py::a", ["model"])]
    assert _ids(ordered(items)) == ["y.py::a", "x.py::fast", "x.py::slow"]


def test_pytest_collects_in_that_order():
    files = ["tests/integration/test_service_startup.py", "tests/unit/test_tier_order.py"]
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *files], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    modules = list(dict.fromkeys(ln.split("::")[0] for ln in done.stdout.splitlines() if "::" in ln))
    assert modules == files[::-1]
