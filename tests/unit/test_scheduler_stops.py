"""StopMatcher: stop sequences over a streamed text, held back until they cannot be a stop."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scheduler.stops import StopMatcher

pytestmark = pytest.mark.unit


def run(stops: list[str], deltas: list[str]) -> tuple[str, bool]:
    """Feed deltas (the last one final) until a match; the emitted text and whether it matched."""
    m = StopMatcher(stops)
    out = []
    for i, d in enumerate(deltas):
        text, hit = m.feed(d, final=i == len(deltas) - 1)
        out.append(text)
        if hit:
            return "".join(out), True
    return "".join(out), False


def test_no_stops_passes_every_delta_through_at_once():
    m = StopMatcher([])
    assert m.feed("hello") == ("hello", False)
    assert m.feed(" world", final=True) == (" world", False)


def test_stop_in_one_delta_cuts_before_it():
    m = StopMatcher(["END"])
    assert m.feed("abcENDxyz") == ("abc", True)


def test_stop_split_across_deltas_is_found_and_not_emitted():
    m = StopMatcher(["END"])  # holds back the last len("END") - 1 characters
    assert m.feed("abcE") == ("ab", False)
    assert m.feed("N") == ("c", False)
    assert m.feed("Dtail") == ("", True)


def test_text_that_only_looked_like_a_stop_is_released():
    m = StopMatcher(["END"])
    assert m.feed("abEN") == ("ab", False)
    assert m.feed("Xyz") == ("ENX", False)
    assert m.feed("", final=True) == ("yz", False)


def test_held_text_is_released_at_final():
    m = StopMatcher(["</s>"])
    assert m.feed("hi</") == ("h", False)
    assert m.feed("", final=True) == ("i</", False)


def test_final_delta_is_still_searched_for_a_stop():
    assert StopMatcher(["END"]).feed("aEND", final=True) == ("a", True)


def test_short_text_is_held_entirely():
    m = StopMatcher(["abcdef"])
    assert m.feed("xy") == ("", False)
    assert m.held == "xy"


def test_single_character_stops_hold_nothing():
    m = StopMatcher(["\n", "."])
    assert m.feed("abc") == ("abc", False)
    assert m.feed("de.f") == ("de", True)


def test_any_of_several_stops_matches():
    assert run(["STOP", "\n\n"], ["one\n", "\ntwo"]) == ("one", True)
    assert run(["STOP", "\n\n"], ["oneST", "OP"]) == ("one", True)


def test_earliest_match_wins_over_list_order():
    assert StopMatcher(["zz", "b"]).feed("abzzb") == ("a", True)
    assert StopMatcher(["b", "zz"]).feed("azzb") == ("a", True)


def test_stop_at_the_very_start_emits_nothing():
    assert run(["<|end|>"], ["<|e", "nd|>more"]) == ("", True)


def test_matcher_after_a_match_starts_clean():
    m = StopMatcher(["END"])
    m.feed("xxEN")
    m.feed("D")
    assert m.held == ""


@settings(max_examples=200, deadline=None)
@given(
    body=st.text(alphabet="abcXY", max_size=30),
    stop=st.text(alphabet="abcXY", min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 40), max_size=6),
)
def test_streamed_result_equals_whole_text_result_for_one_stop(body, stop, cuts):
    idx = body.find(stop)
    expected = (body[:idx], True) if idx >= 0 else (body, False)
    points = sorted({min(c, len(body)) for c in cuts})
    deltas = [body[a:b] for a, b in zip([0] + points, points + [len(body)])]
    assert run([stop], deltas) == expected
