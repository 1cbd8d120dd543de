"""The fast tiers first: `make test` runs unit, then model, then integration, then gpu tests.

Each test module is placed by its slowest tier marker (unmarked between model and integration)
and keeps its tests together, so module fixtures start once; within a tier, collection order.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import Protocol

import pytest

# benchmarks run inside tests take a lock of this run's own, not the machine's: a benchmark a
# developer runs beside the suite is refused by its own lock, and the suite never waits on it
os.environ.setdefault("DUALPATH_BENCH_LOCK", os.path.join(tempfile.mkdtemp(prefix="dualpath-test-"), "bench.lock"))

TIERS = {"unit": 0.0, "model": 1.0, "integration": 3.0, "gpu": 4.0}
UNMARKED = 2.0
# `make mutants`: with a mutant active (mutmut names it in MUTANT_UNDER_TEST) the simulator's end-to-end
# files are skipped; minutes per surviving mutant, they are what made the policy's mutants take hours
MUTANT_SKIPS = ("tests/unit/test_sim_runs.py", "tests/unit/test_sim_online.py")


class _Item(Protocol):
    nodeid: str  # "tests/unit/test_x.py::test_y": its module is the part before "::"

    def iter_markers(self) -> object: ...


def tier(item: _Item) -> float:
    """The slowest tier among the item's markers (its own, its class's, its module's)."""
    ranks = [TIERS[m.name] for m in item.iter_markers() if m.name in TIERS]
    return max(ranks, default=UNMARKED)


def ordered(items: Sequence[_Item]) -> list[_Item]:
    """`items` by their module's tier (its slowest test's), modules kept whole, otherwise as collected."""
    rank: dict[str, float] = {}
    for item in items:
        rank[_module(item)] = max(rank.get(_module(item), 0.0), tier(item))
    return sorted(items, key=lambda item: rank[_module(item)])  # stable: collection order within a tier


def _module(item: _Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = ordered(items)
    if "__mutmut_" in os.environ.get("MUTANT_UNDER_TEST", ""):
        skip = pytest.mark.skip(reason="simulator end-to-end run: left out under mutants (make mutants)")
        for item in items:
            if _module(item) in MUTANT_SKIPS:
                item.add_marker(skip)
