"""The plan builders: one per load mode, the buffered (prefetched, kept) blocks layered in front.
Each plan's ranges are checked exactly, and each passes the message's own check."""
from __future__ import annotations

import pytest

from shared.messages.codes import LoadMode
from shared.messages.plan import KvPlan, KvRange, Source, check
from shared.sched.plan import (BUILDERS, InBuffer, PlanEnds, PlanInput, basic, build, dualpath, dualpath_split,
                               oracle, prompt_blocks, with_buffer)

pytestmark = pytest.mark.unit

ENDS = PlanEnds("pe0", "nA", "de0", "nB")
S, B, P, C = Source.STORE, Source.BUFFER, Source.PRESENT, Source.COMPUTE
PE = dict(node="nA", engine="pe0")
DE = dict(node="nB", engine="de0")


def inp(hits: int = 5, pe_read: int = 0, buffered: InBuffer | None = None, stored: int = 6) -> PlanInput:
    return PlanInput(7, hits, stored, ENDS, pe_read, buffered)


def test_basic_reads_every_hit_on_the_pe_path():
    assert basic(inp(pe_read=0)) == KvPlan([KvRange(0, 5, S, **PE), KvRange(5, 7, C)], stored=6)


@pytest.mark.parametrize(("pe_read", "want"), [
    (5, [KvRange(0, 5, S, **PE), KvRange(5, 7, C)]),  # the PE path's queue was shorter
    (0, [KvRange(0, 5, S, **DE), KvRange(5, 7, C)]),  # the DE path's
])
def test_dualpath_reads_every_hit_on_the_chosen_path(pe_read, want):
    assert dualpath(inp(pe_read=pe_read)) == KvPlan(want, stored=6)


def test_dualpath_split_reads_the_first_hits_on_the_pe_path_and_the_rest_on_the_de_path():
    got = dualpath_split(inp(pe_read=2))
    assert got.ranges == [KvRange(0, 2, S, **PE), KvRange(2, 5, S, **DE), KvRange(5, 7, C)]
    assert got.push and got.persist and got.stored == 6


def test_the_oracle_takes_its_hits_as_present_and_moves_nothing():
    assert oracle(inp()) == KvPlan([KvRange(0, 5, P), KvRange(5, 7, C)], push=False, persist=False, stored=6)
    assert oracle(inp(hits=0)).ranges == [KvRange(0, 7, C)]


@pytest.mark.parametrize("mode", list(LoadMode))
def test_a_miss_computes_every_block_in_every_mode(mode):
    assert build(mode, inp(hits=0, stored=0)).ranges == [KvRange(0, 7, C)]


def test_buffered_blocks_come_first_and_the_reads_follow_them():
    buf = InBuffer(2, "de0", "pf-1", slots=None)
    got = dualpath_split(inp(pe_read=1, buffered=buf))
    assert got.ranges == [KvRange(0, 2, B, engine="de0", owner="pf-1"), KvRange(2, 3, S, **PE),
                          KvRange(3, 5, S, **DE), KvRange(5, 7, C)]
    kept = basic(inp(buffered=InBuffer(5, "de0", "pending-x")))  # a kept turn holds every hit
    assert kept.ranges == [KvRange(0, 5, B, engine="de0", owner="pending-x"), KvRange(5, 7, C)]
    assert with_buffer([KvRange(0, 1, C)], None) == [KvRange(0, 1, C)]


@pytest.mark.parametrize("mode", list(LoadMode))
@pytest.mark.parametrize(("hits", "pe_read", "buffered"), [(5, 0, 0), (5, 3, 0), (5, 1, 2), (6, 0, 6), (1, 1, 0)])
def test_every_mode_builds_a_plan_that_checks(mode, hits, pe_read, buffered):
    buf = InBuffer(buffered, "de0", "pf-1") if buffered and mode is not LoadMode.ORACLE else None
    plan = build(mode, inp(hits, pe_read, buf))
    check(plan)
    assert plan.ranges[-1] == KvRange(hits, 7, C)  # the prompt's end is always computed
    assert set(BUILDERS) == set(LoadMode)


def test_prompt_blocks_counts_a_partial_last_block():
    assert (prompt_blocks(64, 64), prompt_blocks(65, 64), prompt_blocks(1, 64)) == (1, 2, 1)
