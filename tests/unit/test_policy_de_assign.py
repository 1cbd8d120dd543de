"""DE assignment, levels 1 and 2 (spec 7.3), on hand-built states."""
from collections import deque

import pytest

from services.scheduler.policy import EngineReport, Request, assign_decode, pick_de_group, z_threshold

pytestmark = pytest.mark.unit


def rep(engine: int, tokens: int, seq: int, free: int) -> EngineReport:
    return EngineReport(engine=engine, node=0, seq=seq, tokens=tokens, read_q=0, free_mem=free)


def test_level1_picks_smallest_total_tokens_ties_by_id():
    assert pick_de_group({3: 50, 1: 70, 2: 50}) == 2
    with pytest.raises(ValueError):
        pick_de_group({})


def test_z_threshold_counts_only_the_fitting_prefix():
    q = deque([Request(0, 4, 6), Request(1, 4, 6), Request(2, 100, 100)])
    reports = [rep(0, 0, 0, 10), rep(1, 8, 1, 10)]
    # R = first two (12 <= 20); Z = 1.05 * (8 + 8) / 2
    assert z_threshold(q, reports) == pytest.approx(8.4)


def test_docstring_example_prefers_engines_below_z():
    q = deque([Request(1, 4, 4), Request(2, 4, 4)])
    out = assign_decode(q, [rep(0, 0, 0, 10), rep(1, 8, 1, 10)])
    assert [(a.rid, a.engine) for a in out] == [(1, 0), (2, 0)]


def test_below_z_prefers_smallest_seq():
    q = deque([Request(1, 1, 1)])
    out = assign_decode(q, [rep(0, 10, 5, 100), rep(1, 10, 1, 100)])  # Z = 11.025
    assert out[0].engine == 1


def test_above_z_falls_back_to_smallest_tokens():
    q = deque([Request(1, 1000, 10)])
    out = assign_decode(q, [rep(0, 50, 0, 100), rep(1, 40, 9, 100)])
    assert out[0].engine == 1


def test_memory_fit_is_respected_and_unfit_requests_keep_their_place():
    q = deque([Request(1, 5, 50), Request(2, 5, 5), Request(3, 5, 60)])
    out = assign_decode(q, [rep(0, 0, 0, 40), rep(1, 0, 0, 20)])
    assert [(a.rid, a.engine) for a in out] == [(2, 0)]
    assert [r.rid for r in q] == [1, 3]


def test_nothing_placed_when_all_memory_is_used():
    q = deque([Request(1, 1, 1)])
    assert assign_decode(q, [rep(0, 0, 0, 0)]) == []
    assert len(q) == 1
