"""DE assignment, levels 1 and 2 (docs/concepts/design.md#decode-engine-assignment), on hand-built states."""
from collections import deque

import pytest

from shared.sched.policy import EngineReport, Request, assign_decode, pick_de_group, z_threshold

pytestmark = pytest.mark.unit


def rep(engine: int, tokens: int, seq: int, free: int) -> EngineReport:
    return EngineReport(engine=engine, node=0, seq=seq, tokens=tokens, read_q=0, free_mem=free)


def test_level1_picks_smallest_total_tokens_ties_by_id():
    assert pick_de_group({3: 50, 1: 70, 2: 50}) == 2
    with pytest.raises(ValueError, match="^pick_de_group needs at least one DE group$"):
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


def test_below_z_the_smallest_seq_wins_over_the_smallest_tok():
    # Engine 2 holds tokens but no memory: it only raises Z = 1.05 * (1 + 120) / 3 = 42.35,
    # so engines 0 and 1 both stay below Z; engine 1 has fewer requests but more tokens.
    q = deque([Request(1, 1, 1)])
    out = assign_decode(q, [rep(0, 10, 5, 100), rep(1, 20, 1, 100), rep(2, 90, 0, 0)])
    assert out[0].engine == 1


def test_below_z_equal_seq_goes_to_the_fewer_tokens():
    q = deque([Request(1, 1, 1)])
    out = assign_decode(q, [rep(0, 20, 2, 100), rep(1, 5, 2, 100), rep(2, 90, 0, 0)])
    assert out[0].engine == 1


def test_seq_and_tok_count_the_requests_placed_earlier_in_the_same_pull():
    # r1 -> engine 0 (equal seq, fewer tokens); now engine 0 has seq 1, so r2 -> engine 1.
    q = deque([Request(1, 1, 1), Request(2, 1, 1)])
    out = assign_decode(q, [rep(0, 0, 0, 100), rep(1, 20, 0, 100), rep(2, 100, 0, 0)])
    assert [(a.rid, a.engine) for a in out] == [(1, 0), (2, 1)]


@pytest.mark.parametrize("third_tok, expected", [
    (76, 0),  # Z = 1.05 * (10 + 30 + 76) / 3 = 40.6: engine 0 reaches 40 <= Z, its seq 0 wins
    (70, 1),  # Z = 1.05 * (10 + 30 + 70) / 3 = 38.5: engine 0 would exceed Z, only engine 1 is below
])
def test_an_engine_is_below_z_exactly_when_tok_plus_len_is_at_most_z(third_tok, expected):
    # r2 needs more memory than the group has: it is outside R and must not raise Z.
    q = deque([Request(1, 10, 1), Request(2, 30, 1000)])
    reports = [rep(0, 30, 0, 100), rep(1, 0, 5, 100), rep(2, third_tok, 0, 0)]
    assert assign_decode(q, reports)[0].engine == expected


def test_reaching_z_exactly_still_counts_as_below_z():
    # factor 1: Z = (10 + 10 + 0 + 40) / 3 = 20 and engine 0 reaches exactly 20.
    q = deque([Request(1, 10, 1)])
    out = assign_decode(q, [rep(0, 10, 0, 100), rep(1, 0, 5, 100), rep(2, 40, 0, 0)], factor=1.0)
    assert out[0].engine == 0


def test_r_includes_a_request_that_fills_free_memory_exactly():
    q = deque([Request(0, 4, 10), Request(1, 4, 10)])
    assert z_threshold(q, [rep(0, 0, 0, 10), rep(1, 0, 0, 10)]) == pytest.approx(1.05 * 8 / 2)


def test_a_request_that_needs_exactly_the_free_memory_is_placed():
    q = deque([Request(1, 5, 10)])
    out = assign_decode(q, [rep(0, 0, 0, 10)])
    assert [(a.rid, a.engine) for a in out] == [(1, 0)] and not q


@pytest.mark.parametrize("lookahead, placed", [(2, []), (3, [3])])
def test_the_scan_stops_after_r_plus_lookahead_entries(lookahead, placed):
    # The two head requests fit nowhere, so |R| = 0 and the scan covers `lookahead` entries.
    q = deque([Request(1, 5, 500), Request(2, 5, 500), Request(3, 5, 5)])
    out = assign_decode(q, [rep(0, 0, 0, 40)], lookahead=lookahead)
    assert [a.rid for a in out] == placed
    assert [r.rid for r in q] == [r for r in (1, 2, 3) if r not in placed]
