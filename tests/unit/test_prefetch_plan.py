"""The prefetch policy: the idlest storage NIC's side stages a session's KV, within the buffers'
room, early enough to be done when the session is due back; staged prefixes are found by key."""
from __future__ import annotations

import pytest

from shared.sched.policy.read_path import ReadPath
from shared.sched.prefetch import Holder, RecentBytes, StagedSession, StagedIndex, common, hold_until, plan

pytestmark = pytest.mark.unit
MB = 1_000_000


def _holders(pe_q=30 * MB, de_q=0.0, pe_room=100, de_room=100, rate=100 * MB):
    return [Holder("p0-e0", "p0", "prefill", pe_room, pe_q, rate), Holder("d1-e0", "d1", "decode", de_room, de_q, rate)]


def test_the_docstring_example_decode_side_starts_half_a_second_early():
    p = plan(20, MB, now=10.0, return_at=14.0, holders=_holders(), margin=2.0, lead_s=0.1)
    assert (p.engine, p.side, p.blocks) == ("d1-e0", ReadPath.DE, 20)
    assert p.start_at == pytest.approx(13.5)


def test_the_shorter_read_queue_wins_ties_read_on_the_prefill_side():
    assert plan(4, MB, 0, 10, _holders(pe_q=0, de_q=5 * MB)).side is ReadPath.PE
    assert plan(4, MB, 0, 10, _holders(pe_q=0, de_q=0)).side is ReadPath.PE


def test_preferring_the_prefill_side_stages_there_whenever_its_read_ends_before_the_return():
    # 30 MB queued on p0, none on d1: the idler NIC is d1's, but p0's read (2 x 50 MB / 100 MB/s + 0.1 s
    # = 1.1 s of lead) still ends before the session is due 4 s from now
    p = plan(20, MB, now=10.0, return_at=14.0, holders=_holders(), margin=2.0, lead_s=0.1, prefer_pe=True)
    assert (p.engine, p.side, p.blocks) == ("p0-e0", ReadPath.PE, 20)
    assert p.start_at == pytest.approx(12.9) and "prefill side" in p.reason
    # too short a tool call for p0's queue: the idler NIC's side, as without the preference
    short = plan(20, MB, now=10.0, return_at=10.5, holders=_holders(), prefer_pe=True)
    assert short.side is ReadPath.DE
    # no prefetch room on the prefill side: the decode side
    assert plan(20, MB, 10.0, 14.0, _holders(pe_room=0), prefer_pe=True).side is ReadPath.DE
    # an unknown rate: the fixed lead decides the fit
    assert plan(4, MB, 0.0, 10.0, _holders(rate=0.0), prefer_pe=True).side is ReadPath.PE
    assert plan(4, MB, 0.0, 1.0, _holders(rate=0.0), prefer_pe=True).side is ReadPath.DE


def test_the_read_path_setting_forces_a_side():
    assert plan(4, MB, 0, 10, _holders(pe_q=0, de_q=5 * MB), force="de").engine == "d1-e0"
    assert plan(4, MB, 0, 10, _holders(pe_q=9 * MB, de_q=0), force="pe").engine == "p0-e0"
    assert plan(4, MB, 0, 10, _holders(de_room=0), force="de") is None


def test_a_side_without_room_leaves_the_other_and_the_budget_cuts_the_tail():
    p = plan(50, MB, 0, 10, _holders(pe_q=0, de_q=9 * MB, pe_room=0, de_room=30))
    assert (p.engine, p.blocks) == ("d1-e0", 30)
    assert plan(5, MB, 0, 10, _holders(pe_room=0, de_room=0)) is None
    assert plan(0, MB, 0, 10, _holders()) is None


def test_a_short_tool_call_or_an_unknown_rate_starts_now_or_a_fixed_lead_early():
    assert plan(20, MB, now=10.0, return_at=10.1, holders=_holders()).start_at == 10.0  # shorter than the read
    p = plan(20, MB, now=10.0, return_at=30.0, holders=_holders(rate=0.0), unknown_rate_lead_s=2.0)
    assert p.start_at == pytest.approx(28.0)


def test_unclaimed_staged_blocks_wait_past_the_return_but_never_past_the_ttl():
    assert hold_until(return_at=14.0, tool_s=4.0, grace_s=5.0) == 19.0
    assert hold_until(return_at=40.0, tool_s=30.0, grace_s=5.0) == 70.0
    assert hold_until(return_at=14.0, tool_s=4.0, grace_s=5.0, ttl_s=6.0) == 16.0  # turn end (10) + ttl


def test_the_longest_staged_prefix_is_found_claimed_once_and_accounted_per_engine():
    idx = StagedIndex()
    keys = [bytes([i]) * 16 for i in range(10)]
    idx.add(StagedSession("a", "e0", "n0", keys[:3], until=5.0))
    idx.add(StagedSession("b", "e1", "n1", keys[:6], until=9.0))
    idx.add(StagedSession("other", "e1", "n1", [b"z" * 16], until=1.0))
    assert idx.held == {"e0": 3, "e1": 7}
    s = idx.match(keys[:8])
    assert s.owner == "b"
    s.claimed_by = "req-1"
    assert idx.match(keys[:8]).owner == "a"  # a claimed entry is nobody else's
    assert idx.match([b"q" * 16]) is None and idx.match(keys[1:4]) is None  # a prefix must start at block 0
    fresh = StagedIndex()
    fresh.add(StagedSession("c", "e0", "n0", keys[:6], until=5.0))
    respelled = keys[:4] + [b"r" * 16]  # the next prompt re-spells block 4: blocks 0..3 are still of use
    assert fresh.match(respelled).owner == "c" and common(fresh.by_owner["c"].keys, respelled) == 4
    assert [x.owner for x in idx.expired(6.0)] == ["a", "other"]  # claimed ones never expire here
    idx.remove("a")
    idx.remove("b")
    assert idx.held == {"e1": 1}
    idx.check_integrity()


def test_recent_prefetch_bytes_decay_so_idle_nics_share_the_prefetches():
    r = RecentBytes(half_life_s=1.0)
    r.add("p0", 8.0, now=0.0)
    assert r.get("p0", 0.0) == 8.0 and r.get("p0", 2.0) == pytest.approx(2.0) and r.get("d1", 5.0) == 0.0
    r.add("p0", 2.0, now=2.0)
    assert r.get("p0", 3.0) == pytest.approx(2.0)
    # two idle nodes: the second prefetch goes where the first did not
    hs = lambda: [Holder("p0-e0", "p0", "prefill", 99, r.get("p0", 3.0)), Holder("d1-e0", "d1", "decode", 99, 0.0)]
    assert plan(4, MB, 3.0, 9.0, hs()).engine == "d1-e0"
