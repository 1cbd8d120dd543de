"""Verbs backend pure parts: MR translation, WR batching, setup messages, SL mapping."""

import pytest

from shared.transport.base import Op, RegionDesc, TrafficClass
from shared.transport.errors import OutOfBounds, RegionNotFound
from shared.transport.verbs_plan import (
    SL_DEFAULT, ConnectReply, ConnectRequest, MrBook, QpInfo, Wr, decode_setup, encode_setup, plan, sl_for,
)

pytestmark = pytest.mark.unit


def book() -> MrBook:
    b = MrBook()
    b.add_local("kv", addr=0x1000, length=1 << 20, lkey=11)
    b.set_remote([RegionDesc("buf", 1 << 16, rid=1, addr=0x9000_0000, rkey=77)])
    return b


def test_translate_adds_offsets_and_picks_keys():
    assert book().translate(Op("kv", 64, "buf", 128, 256)) == Wr(0x1040, 11, 0x9000_0080, 77, 256)


def test_translate_rejects_unknown_regions_and_bad_bounds():
    b = book()
    with pytest.raises(RegionNotFound) as e:
        b.translate(Op("nope", 0, "buf", 0, 1))
    assert e.value.where == "local"
    with pytest.raises(RegionNotFound) as e:
        b.translate(Op("kv", 0, "nope", 0, 1))
    assert e.value.where == "remote"
    with pytest.raises(OutOfBounds) as oob:
        b.translate(Op("kv", 0, "buf", (1 << 16) - 1, 2))
    assert (oob.value.region, oob.value.offset, oob.value.length, oob.value.size) == ("buf", (1 << 16) - 1, 2, 1 << 16)


def wrs(n: int, size: int) -> list[Wr]:
    return [Wr(i * size, 1, i * size, 2, size) for i in range(n)]


def test_plan_chains_up_to_max_wr_and_signals_only_the_last():
    batches = plan(wrs(130, 4096), max_wr=64)
    assert [len(b.wrs) for b in batches] == [64, 64, 2]
    for b in batches:
        assert b.signaled == [False] * (len(b.wrs) - 1) + [True]
    assert [w for b in batches for w in b.wrs] == wrs(130, 4096)


def test_plan_respects_byte_budget_and_splits_huge_messages():
    assert [len(b.wrs) for b in plan(wrs(5, 100), max_wr=64, max_bytes=250)] == [2, 2, 1]
    (batch,) = plan([Wr(0, 1, 1000, 2, 25)], max_msg=10)
    assert [(w.laddr, w.raddr, w.length) for w in batch.wrs] == [(0, 1000, 10), (10, 1010, 10), (20, 1020, 5)]
    assert plan([]) == []


def test_setup_messages_round_trip_as_a_tagged_union():
    qps = [QpInfo(TrafficClass.LATENCY, 0x11, 0xABC, 3), QpInfo(TrafficClass.BULK, 0x12, 0xDEF, 0)]
    regions = [RegionDesc("buf", 4096, rid=1, addr=0x7F00, rkey=9)]
    for msg in (ConnectRequest("pe0", 1, "fe80::1", qps, regions), ConnectReply("de0", 2, "fe80::2", qps)):
        assert decode_setup(encode_setup(msg)) == msg


def test_each_class_gets_its_own_service_level():
    assert sl_for(TrafficClass.LATENCY) != sl_for(TrafficClass.BULK)
    assert sl_for(TrafficClass.BULK, {0: 5, 1: 1}) == 1
    assert set(SL_DEFAULT) == {TrafficClass.LATENCY, TrafficClass.BULK}
