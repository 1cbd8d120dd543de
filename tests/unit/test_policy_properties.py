"""Property tests of the policy: conservation, FIFO, classes, memory (hypothesis)."""
from collections import deque

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.unit.counted_model import Counted
from shared.sched.policy import (AttentionModel, EngineReport, PeThresholds, ReadyPrefill,
                                       Request, assign_decode, assign_prefill, plan_batch, split_read)

pytestmark = pytest.mark.unit

requests = st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 3000)), max_size=40)
pe_engines = st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 400)), min_size=1, max_size=12)
de_engines = st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 10), st.integers(0, 8000)),
                      min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(requests, pe_engines, st.integers(0, 400), st.integers(0, 3000))
def test_pe_assignment_loses_nothing_keeps_fifo_and_skips_class1(reqs, engines, alpha, beta):
    th = PeThresholds(alpha, beta)
    q = deque(Request(i, tok) for i, (tok, _) in enumerate(reqs))
    reports = [EngineReport(100 + i, i, 0, tok, rq) for i, (tok, rq) in enumerate(engines)]
    out = assign_prefill(q, reports, th)
    got = [a.rid for a in out]
    assert got == list(range(len(got)))  # FIFO: a prefix of the queue, in order
    assert sorted(got + [r.rid for r in q]) == list(range(len(reqs)))  # none lost or duplicated
    tok = {r.engine: r.tokens for r in reports}
    for a in out:
        assert tok[a.engine] <= beta  # never handed to a class-1 engine
        tok[a.engine] += reqs[a.rid][0]
    if q:  # stopped early only because every engine is class 1
        assert all(t > beta for t in tok.values())


@settings(max_examples=150, deadline=None)
@given(requests, de_engines)
def test_de_assignment_respects_memory_and_conserves_requests(reqs, engines):
    q = deque(Request(i, tok, mem) for i, (tok, mem) in enumerate(reqs))
    reports = [EngineReport(i, 0, seq, tok, 0, free) for i, (tok, seq, free) in enumerate(engines)]
    out = assign_decode(q, reports)
    got = [a.rid for a in out]
    assert len(set(got)) == len(got)
    assert sorted(got + [r.rid for r in q]) == list(range(len(reqs)))
    used = {r.engine: 0 for r in reports}
    for a in out:
        used[a.engine] += reqs[a.rid][1]
    for r in reports:
        assert used[r.engine] <= r.free_mem
    left = [r.rid for r in q]
    assert left == sorted(left)  # unplaced requests keep their relative order


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 500), st.integers(0, 20000), st.integers(0, 20000),
       st.floats(0.1, 10), st.floats(0.1, 10), st.sampled_from([16, 64, 256]))
@example(10, 0, 100, 1.0, 1.0, 64)  # the PE side needs 5.78 blocks: 6, not 5
@example(10, 576, 0, 1.0, 1.0, 64)  # 0.5 blocks: either way is exactly one block apart
@example(10, 640, 0, 1.0, 1.0, 64)  # PE already as long as DE plus every hit: all on DE
def test_split_read_leaves_both_queues_within_a_block_of_each_other(n, pq, dq, pr, dr, bt):
    pe, de = split_read(n, pq, dq, pr, dr, bt)
    assert pe + de == n and pe >= 0 and de >= 0
    if pq / pr >= (dq + n * bt) / dr:  # PE ends last even if DE reads every hit
        assert (pe, de) == (0, n)
    elif dq / dr >= (pq + n * bt) / pr:
        assert (pe, de) == (n, 0)
    else:  # both drain times as close as whole blocks allow: half a block on each side
        pe_end, de_end = (pq + pe * bt) / pr, (dq + de * bt) / dr
        assert abs(pe_end - de_end) <= (bt / pr + bt / dr) / 2 * (1 + 1e-9)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20000), st.integers(1, 5000)), min_size=1, max_size=10),
       st.floats(1e-4, 1.0), st.sampled_from([0, 0, 8, 100, 3000]))
def test_plan_batch_is_a_fifo_prefix_within_quota(work, quota, max_tokens):
    Counted.calls = 0  # a search that never ends fails, not hangs
    model = Counted(per_pair=1e-8, per_token=1e-6, per_batch=1e-5)
    items = [ReadyPrefill(i, c, r) for i, (c, r) in enumerate(work)]
    out = plan_batch(items, model, quota, align=16, max_tokens=max_tokens)
    if max_tokens:
        assert sum(c.bsz for c in out) <= max_tokens
    assert out and [c.rid for c in out] == list(range(len(out)))
    assert all(c.bsz == items[c.rid].remaining for c in out[:-1])
    assert 0 < out[-1].bsz <= items[out[-1].rid].remaining
    if len(out) > 1 or out[0].bsz > 16:
        assert model.batch_time((c.cached, c.bsz) for c in out) <= quota + 1e-12
