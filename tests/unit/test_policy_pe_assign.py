"""Algorithm 1 (docs/concepts/design.md#prefill-engine-assignment-algorithm-1) on hand-built group states."""
from collections import deque

import pytest

from shared.sched.policy import (EngineClass, EngineReport, PeThresholds, Request,
                                       assign_prefill, classify)

pytestmark = pytest.mark.unit
TH = PeThresholds(alpha=100, beta=1000)


def rep(engine: int, tokens: int, read_q: int) -> EngineReport:
    return EngineReport(engine=engine, node=engine // 8, seq=0, tokens=tokens, read_q=read_q)


def test_classes_follow_alpha_and_beta():
    assert classify(rep(0, 1001, 0), 1001, TH) is EngineClass.OVERLOADED
    assert classify(rep(0, 1000, 100), 1000, TH) is EngineClass.IDEAL
    assert classify(rep(0, 10, 101), 10, TH) is EngineClass.DISK_PRESSURED


def test_class2_before_class3_even_with_more_tokens():
    q = deque([Request(1, 10)])
    out = assign_prefill(q, [rep(0, 0, 500), rep(1, 900, 0)], TH)
    assert [(a.rid, a.engine) for a in out] == [(1, 1)]


def test_smallest_tokens_within_a_class_and_tokens_accumulate():
    q = deque(Request(i, 300) for i in range(3))
    out = assign_prefill(q, [rep(0, 200, 0), rep(1, 100, 0)], TH)
    # r0 -> e1 (100 -> 400), r1 -> e0 (200 -> 500), r2 -> e1 (400 -> 700)
    assert [a.engine for a in out] == [1, 0, 1]


def test_docstring_example_moves_to_class3_when_class2_overflows():
    q = deque(Request(i, 600) for i in range(1, 5))
    out = assign_prefill(q, [rep(10, 0, 0), rep(11, 0, 500)], TH)
    assert [(a.rid, a.engine) for a in out] == [(1, 10), (2, 10), (3, 11), (4, 11)]
    assert not q


def test_overloaded_engines_get_nothing_and_queue_keeps_order():
    q = deque(Request(i, 5) for i in range(3))
    assert assign_prefill(q, [rep(0, 1001, 0), rep(1, 5000, 999)], TH) == []
    assert [r.rid for r in q] == [0, 1, 2]


def test_stops_when_both_classes_empty_and_leaves_the_rest_in_fifo_order():
    q = deque([Request(0, 900), Request(1, 900), Request(2, 1)])
    out = assign_prefill(q, [rep(0, 200, 0)], TH)
    assert [a.rid for a in out] == [0]  # 200 + 900 > beta: engine leaves class 2
    assert [r.rid for r in q] == [1, 2]


def test_an_engine_that_reaches_beta_exactly_stays_ideal():
    q = deque([Request(1, 1000), Request(2, 5)])
    out = assign_prefill(q, [rep(0, 0, 0)], TH)
    assert [(a.rid, a.engine) for a in out] == [(1, 0), (2, 0)]  # tok 1000 <= beta


@pytest.mark.parametrize("read_q", [0, 500])  # class 2, then class 3
def test_equal_tokens_go_to_the_engine_listed_first(read_q):
    q = deque([Request(1, 10)])
    out = assign_prefill(q, [rep(7, 50, read_q), rep(3, 50, read_q), rep(5, 50, read_q)], TH)
    assert out[0].engine == 7
