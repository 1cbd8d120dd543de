"""The KV plan message: its checks (contiguous from block 0, loads before compute, engines named),
its counting helpers, and its wire form inside PrefillWork."""
from __future__ import annotations

import msgspec
import pytest

from shared.messages.codes import ErrorCode
from shared.messages.plan import KvPlan, KvRange, PlanError, Source, blocks, check, first, loaded
from shared.messages.work import PrefillWork, Sampling

pytestmark = pytest.mark.unit

S, B, P, C = Source.STORE, Source.BUFFER, Source.PRESENT, Source.COMPUTE
SPLIT = KvPlan([KvRange(0, 2, B, engine="de0", owner="pf-1"), KvRange(2, 3, S, node="nA", engine="pe0"),
                KvRange(3, 5, S, node="nB", engine="de0"), KvRange(5, 7, C)], stored=6)


def test_a_well_formed_plan_passes_and_counts_by_source():
    check(SPLIT)
    check(KvPlan())  # nothing planned: every block computed
    assert loaded(SPLIT) == 5 and loaded(KvPlan()) == 0
    assert (blocks(SPLIT, B), blocks(SPLIT, S), blocks(SPLIT, S, "de0"), blocks(SPLIT, C)) == (2, 3, 2, 2)
    assert first(SPLIT, B).owner == "pf-1" and first(SPLIT, P) is None


@pytest.mark.parametrize(("ranges", "why"), [
    ([KvRange(1, 3, C)], "does not follow block 0"),  # not from block 0
    ([KvRange(0, 2, P), KvRange(3, 4, C)], "does not follow block 2"),  # a gap
    ([KvRange(0, 3, P), KvRange(2, 4, C)], "does not follow block 3"),  # an overlap
    ([KvRange(0, 0, P)], "does not follow"),  # empty
    ([KvRange(0, 2, C), KvRange(2, 3, S, engine="pe0")], "after a computed one"),
    ([KvRange(0, 2, S)], "names no engine"),
    ([KvRange(0, 2, B, engine="de0")], "names no engine or owner"),
])
def test_a_malformed_plan_is_a_typed_error(ranges, why):
    with pytest.raises(PlanError, match=why) as got:
        check(KvPlan(ranges))
    assert got.value.code is ErrorCode.BAD_PLAN


def test_ranges_built_with_plain_strings_check_as_their_sources():
    check(KvPlan([KvRange(0, 1, "store", engine="pe0"), KvRange(1, 2, "compute")]))
    assert blocks(KvPlan([KvRange(0, 3, "present")]), Source.PRESENT) == 3


def test_the_plan_travels_inside_the_work_and_an_old_work_means_compute_everything():
    work = PrefillWork("r#0", [1, 2, 3], Sampling(), "de0", "out", plan=SPLIT)
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(work), type=PrefillWork)
    assert back.plan == SPLIT and back.plan.ranges[1].source is Source.STORE
    bare = msgspec.msgpack.decode(msgspec.msgpack.encode({"req_id": "r#0", "prompt": [1], "sampling": {},
                                                          "de_engine": "d", "reply": "o"}), type=PrefillWork)
    assert bare.plan == KvPlan() and bare.plan.push and bare.plan.persist
