"""Pure engine policy: prefill batch selection, decode finish/admission, per-request helpers."""
from __future__ import annotations

import types

import pytest

from services.decode_engine.running import RunningSeq, admit_order, finish_reason
from shared.engine import requests as requests_mod
from shared.engine.requests import EngineRequest, RecentSet, generator_seed, stop_ids
from shared.messages.work import Sampling

pytestmark = pytest.mark.unit


# --- decode: finish_reason, admit_order --------------------------------------------------------

def ereq(rid="r", prompt=4, generated=(), **sampling) -> EngineRequest:
    return EngineRequest(rid, list(range(prompt)), Sampling(**sampling), "out.s", None,
                         generated=list(generated))


def seq(generated, max_tokens=16, pos=None, max_pos=1000, stops=()) -> RunningSeq:
    r = ereq(prompt=4, generated=generated, max_tokens=max_tokens)
    return RunningSeq(r, pos=4 + len(generated) - 1 if pos is None else pos, last=generated[-1],
                      max_pos=max_pos, stops=set(stops))


def test_running_seq_index_is_the_next_generated_position():
    assert seq([5, 6, 7]).index == 3


def test_engine_request_tokens_count_prompt_and_generated():
    assert ereq(prompt=4, generated=[1, 2]).tokens == 6


def test_keeps_going_below_every_limit():
    assert finish_reason(seq([5, 6]), 6) is None


def test_stop_token_finishes_with_stop():
    assert finish_reason(seq([5, 2], stops={2}), 2) == "stop"


def test_stop_token_wins_over_length_on_the_last_token():
    assert finish_reason(seq([5, 2], max_tokens=2, stops={2}), 2) == "stop"


def test_reaching_max_tokens_finishes_with_length():
    assert finish_reason(seq([5, 6, 7], max_tokens=3), 7) == "length"
    assert finish_reason(seq([5, 6], max_tokens=3), 6) is None


def test_reaching_the_context_limit_finishes_with_length():
    # prompt 4 + generated 3: the new token sits at position 6; max_pos 7 means no room for its KV
    assert finish_reason(seq([5, 6, 7], max_pos=7), 7) == "length"
    assert finish_reason(seq([5, 6, 7], max_pos=8), 7) is None


def waiting(*ids: str) -> list[EngineRequest]:
    return [ereq(i) for i in ids]


def test_admit_takes_fifo_prefix_that_fits_blocks():
    need = {"a": 2, "b": 3, "c": 4, "d": 1}
    got = admit_order(waiting("a", "b", "c", "d"), 6, lambda r: need[r.req_id], room=10)
    assert [r.req_id for r in got] == ["a", "b"]  # c does not fit; d may not overtake it


def test_admit_respects_batch_room():
    got = admit_order(waiting("a", "b", "c"), 100, lambda r: 1, room=2)
    assert [r.req_id for r in got] == ["a", "b"]


@pytest.mark.parametrize("room", [0, -1])
def test_admit_with_no_room_admits_nothing(room):
    assert admit_order(waiting("a"), 100, lambda r: 1, room=room) == []


def test_admit_may_use_every_free_block():
    got = admit_order(waiting("a", "b"), 5, lambda r: {"a": 2, "b": 3}[r.req_id], room=5)
    assert [r.req_id for r in got] == ["a", "b"]


def test_admit_does_not_mutate_the_waiting_list():
    w = waiting("a", "b")
    admit_order(w, 100, lambda r: 1, room=5)
    assert [r.req_id for r in w] == ["a", "b"]


# --- shared/engine/requests ----------------------------------------------------------------------

def test_stop_ids_include_eos_and_request_stops():
    assert stop_ids(Sampling(stop_token_ids=[7, 8]), (2, 3)) == {2, 3, 7, 8}


def test_ignore_eos_drops_eos_but_keeps_request_stops():
    assert stop_ids(Sampling(stop_token_ids=[7], ignore_eos=True), (2, 3)) == {7}


def test_stop_ids_do_not_alias_the_sampling_list():
    s = Sampling(stop_token_ids=[7])
    stop_ids(s, (2,)).add(99)
    assert s.stop_token_ids == [7]


def test_unseeded_request_has_no_generator_seed():
    assert generator_seed(Sampling(), 0) is None


def test_seed_is_deterministic_per_step_and_differs_across_steps():
    s = Sampling(seed=42)
    assert generator_seed(s, 3) == generator_seed(Sampling(seed=42), 3)
    assert len({generator_seed(s, step) for step in range(100)}) == 100


def test_seed_zero_is_a_seed_not_none():
    assert generator_seed(Sampling(seed=0), 0) == 0


@pytest.mark.parametrize("seed", [-1, -(2 ** 63), 2 ** 62, 2 ** 70])
def test_generator_seed_fits_a_non_negative_int64(seed):
    value = generator_seed(Sampling(seed=seed), 5)
    assert 0 <= value < 2 ** 63


def test_different_seeds_give_different_streams():
    assert generator_seed(Sampling(seed=1), 0) != generator_seed(Sampling(seed=2), 0)


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(requests_mod, "time", types.SimpleNamespace(monotonic=c))
    return c


def test_recent_set_remembers_added_ids(clock):
    rs = RecentSet()
    rs.add("a")
    assert "a" in rs and "b" not in rs


def test_recent_set_forgets_after_ttl(clock):
    rs = RecentSet(ttl_s=10)
    rs.add("a")
    clock.t += 10
    assert "a" in rs  # boundary: still remembered
    clock.t += 0.5
    assert "a" not in rs


def test_recent_set_is_bounded_by_count_dropping_oldest(clock):
    rs = RecentSet(max_items=3)
    for i, k in enumerate("abcd"):
        rs.add(k, now=clock.t + i)
    assert "a" not in rs and all(k in rs for k in "bcd")
    assert len(rs._items) == 3


def test_re_adding_refreshes_age_and_order(clock):
    rs = RecentSet(max_items=2, ttl_s=10)
    rs.add("a", now=1000.0)
    rs.add("b", now=1001.0)
    rs.add("a", now=1002.0)  # a is newest now
    rs.add("c", now=1003.0)  # evicts b, the oldest
    assert "a" in rs and "c" in rs and "b" not in rs


def test_recent_set_prunes_expired_entries_on_add(clock):
    rs = RecentSet(max_items=100, ttl_s=5)
    for i in range(10):
        rs.add(f"old{i}", now=1000.0)
    rs.add("new", now=1010.0)
    assert list(rs._items) == ["new"]
