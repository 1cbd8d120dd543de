"""DE assignment, levels 1 and 2 (docs/concepts/design.md#decode-engine-assignment), on hand-built states."""
from collections import deque

import pytest

from shared.sched.policy import EngineReport, Request, assign_decode, pick_de_group, z_threshold
from shared.sched.policy import de_assign
from shared.sched.policy.de_assign import _choose_engine, fit_count

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


def test_fit_count_adds_up_the_memory_of_every_request_from_the_head():
    q = deque([Request(1, 1, 4), Request(2, 1, 4), Request(3, 1, 4), Request(4, 1, 1)])
    assert fit_count(q, 10) == 2  # 4 + 4 = 8 fits, + 4 = 12 does not (and the scan stops there)
    assert fit_count(q, 12) == 3


def test_no_engines_places_nothing_and_keeps_the_queue():
    q = deque([Request(1, 1, 1)])
    assert assign_decode(q, []) == [] and [r.rid for r in q] == [1]


def test_choose_engine_answers_minus_one_when_no_engine_fits():
    assert _choose_engine(Request(1, 1, 50), [0, 0], [0, 0], [10, 40], 100.0) == -1


def test_an_engine_too_small_does_not_hide_the_engines_after_it():
    q = deque([Request(1, 5, 30)])
    out = assign_decode(q, [rep(0, 0, 0, 10), rep(1, 0, 0, 40)])
    assert [(a.rid, a.engine) for a in out] == [(1, 1)]


@pytest.mark.parametrize("tokens", [1, 1000])  # both engines below Z (51 <= 53.03); both above (1050 > 577.5)
def test_an_exact_tie_goes_to_the_first_engine_reported(tokens):
    out = assign_decode(deque([Request(1, tokens, 10)]), [rep(7, 50, 1, 100), rep(3, 50, 1, 100)])
    assert out[0].engine == 7


def test_the_scan_covers_r_plus_lookahead_entries_when_r_is_not_empty():
    # |R| = 1 (5 fits 40, 5 + 500 does not), lookahead 1: the scan stops after the big request.
    q = deque([Request(1, 5, 5), Request(2, 5, 500), Request(3, 5, 5)])
    out = assign_decode(q, [rep(0, 0, 0, 40)], lookahead=1)
    assert [a.rid for a in out] == [1] and [r.rid for r in q] == [2, 3]


def test_the_pull_goes_on_while_any_engine_has_room():
    # r1 leaves engine 0 with 1 free; r2 and r3 fill the last unit of each engine in turn.
    q = deque([Request(1, 1, 10), Request(2, 1, 1), Request(3, 1, 1)])
    out = assign_decode(q, [rep(0, 0, 0, 11), rep(1, 0, 5, 1)])
    assert sorted(a.rid for a in out) == [1, 2, 3] and not q


def test_a_request_without_memory_on_a_full_engine_does_not_end_the_pull():
    # r1 (no memory) goes to engine 0 (fewer requests) though it has none free; engine 1 still has room.
    q = deque([Request(1, 1, 0), Request(2, 1, 10)])
    out = assign_decode(q, [rep(0, 0, 0, 0), rep(1, 0, 5, 10)])
    assert [(a.rid, a.engine) for a in out] == [(1, 0), (2, 1)] and not q


class Unread:
    """A queue entry the pull must not look at."""

    def __getattr__(self, name):
        raise AssertionError(f"read {name} of an entry the pull had no need to see")


@pytest.mark.parametrize("free, mem", [([10, 0], 10), ([1], 1)])
def test_the_pull_stops_reading_the_queue_once_every_engine_is_full(free, mem):
    # r1 fills the only engine with room; r2 keeps |R| at 1; nothing after r1 can fit anywhere.
    untouched = Unread()
    q = deque([Request(1, 1, mem), Request(2, 1, mem), untouched])
    out = assign_decode(q, [rep(i, 0, 0, f) for i, f in enumerate(free)])
    assert [a.rid for a in out] == [1] and len(q) == 2 and q[-1] is untouched


def test_a_window_where_nothing_fits_is_given_up_without_reading_past_it():
    untouched = Unread()
    q = deque([Request(1, 1, 500), Request(2, 1, 500), untouched])
    assert assign_decode(q, [rep(0, 0, 0, 40)], lookahead=2) == [] and q[-1] is untouched


def test_a_request_larger_than_every_engines_free_memory_is_kept_without_scanning_the_engines(monkeypatch):
    real, calls = de_assign._choose_engine, []

    def counted(req, *rest):
        calls.append(req.rid)
        return real(req, *rest)
    monkeypatch.setattr(de_assign, "_choose_engine", counted)
    # r1 fills engine 0 (the roomiest); r2 would have fitted it before, and fits engine 1 (3 free) never.
    q = deque([Request(1, 1, 10), Request(2, 1, 5)])
    out = assign_decode(q, [rep(0, 0, 0, 10), rep(1, 0, 0, 3)])
    assert [a.rid for a in out] == [1] and [r.rid for r in q] == [2]
    assert calls == [1]
