"""Intra-PE batching: attention-time model, compute quota, chunk binary search (7.5)."""
import math

import pytest

from shared.sched.policy import AttentionModel, ReadyPrefill, plan_batch
from shared.sched.policy.intra_pe import PlannedChunk
from tests.unit.counted_model import Counted, fresh_count  # noqa: F401 (an autouse fixture)

pytestmark = pytest.mark.unit


M = Counted(per_pair=1e-6, per_token=1e-5)


@pytest.mark.parametrize("hi,align", [(4096, 1), (4096, 64), (1000, 7), (1, 1)])
def test_the_chunk_search_is_a_binary_search(hi, align):
    """A request over the quota costs at most log2(hi / align) + 2 evaluations: one for the whole, one per halving."""
    quota = M.request_time(0, hi) / 3
    Counted.calls = 0
    out = plan_batch([ReadyPrefill(1, 0, hi)], M, quota=quota, align=align)
    assert Counted.calls <= max(1, (hi // align)).bit_length() + 2
    assert M.request_time(0, out[0].bsz) <= quota or out[0].bsz == min(align, hi)


def test_attention_time_counts_causal_pairs_and_tokens():
    assert M.request_time(10, 2) == pytest.approx((10 * 2 + 3) * 1e-6 + 2e-5)
    assert M.batch_time([(10, 2), (0, 0)]) == pytest.approx(M.request_time(10, 2))


def test_capped_pairs_for_sparse_attention():
    m = Counted(per_capped_pair=1.0, cap=5)
    assert m.request_time(3, 4) == 4 + 5 + 5 + 5  # spans 4,5,6,7 capped at 5
    assert m.request_time(100, 2) == 10


def test_fifo_until_quota_then_a_binary_searched_chunk():
    work = [ReadyPrefill(1, 0, 100), ReadyPrefill(2, 0, 100), ReadyPrefill(3, 0, 100)]
    one = M.request_time(0, 100)
    quota = one * 1.5
    out = plan_batch(work, M, quota)
    assert [c.rid for c in out] == [1, 2]
    bsz = out[1].bsz
    assert 0 < bsz < 100
    assert M.batch_time([(0, 100), (0, bsz)]) <= quota < M.batch_time([(0, 100), (0, bsz + 1)])


def test_chunks_are_aligned_and_a_huge_first_request_still_progresses():
    out = plan_batch([ReadyPrefill(7, 5000, 4096)], M, quota=1e-9, align=64)
    assert [(c.rid, c.cached, c.bsz) for c in out] == [(7, 5000, 64)]
    out = plan_batch([ReadyPrefill(7, 0, 4096)], M, quota=M.request_time(0, 1000), align=64)
    assert out[0].bsz % 64 == 0 and M.request_time(0, out[0].bsz) <= M.request_time(0, 1000)


def test_lazy_work_is_consumed_only_as_far_as_needed():
    seen = []

    def gen():
        for i in range(100):
            seen.append(i)
            yield ReadyPrefill(i, 0, 1000)

    plan_batch(gen(), M, quota=M.request_time(0, 1000) * 2.5)
    assert len(seen) == 3


LINEAR = Counted(per_token=1.0)  # one second per new token: exact sums, exact boundaries


def test_a_chunk_that_exactly_fills_the_quota_is_taken():
    assert [c.bsz for c in plan_batch([ReadyPrefill(1, 0, 20)], LINEAR, quota=10.0)] == [10]


def test_the_per_batch_cost_counts_against_the_quota():
    m = Counted(per_token=1.0, per_batch=5.0)
    assert [c.bsz for c in plan_batch([ReadyPrefill(1, 0, 20)], m, quota=15.0)] == [10]
    assert m.batch_time([]) == 0.0 and m.batch_time([(100, 0)]) == 0.0  # no work, no batch cost


def test_requests_with_nothing_left_are_skipped_not_batch_ending():
    out = plan_batch([ReadyPrefill(1, 50, 0), ReadyPrefill(2, 0, 10)], LINEAR, quota=100.0)
    assert [(c.rid, c.bsz) for c in out] == [(2, 10)]


def test_max_tokens_caps_the_batch_across_requests():
    work = [ReadyPrefill(1, 0, 30), ReadyPrefill(2, 0, 30), ReadyPrefill(3, 0, 30)]
    out = plan_batch(work, LINEAR, quota=1000.0, max_tokens=50)
    assert [(c.rid, c.bsz) for c in out] == [(1, 30), (2, 20)]


def test_a_cut_at_max_tokens_that_exactly_fills_the_quota_is_not_rounded_to_align():
    work = [ReadyPrefill(1, 0, 10), ReadyPrefill(2, 0, 100)]
    out = plan_batch(work, LINEAR, quota=60.0, align=64, max_tokens=60)
    assert [(c.rid, c.bsz) for c in out] == [(1, 10), (2, 50)]


def test_the_progress_chunk_never_exceeds_remaining_or_max_tokens():
    assert [c.bsz for c in plan_batch([ReadyPrefill(1, 0, 10)], LINEAR, quota=1.0, align=64)] == [10]
    out = plan_batch([ReadyPrefill(1, 0, 100)], LINEAR, quota=1.0, align=64, max_tokens=8)
    assert [c.bsz for c in out] == [8]


def test_a_whole_request_is_never_cut():
    m = Counted(per_token=0.1)
    # fits: taken whole like any other
    assert plan_batch([ReadyPrefill(0, 0, 2, whole=True)], m, quota=1.0) == [PlannedChunk(0, 0, 2)]
    # does not fit behind another: the batch ends before it
    planned = plan_batch([ReadyPrefill(0, 0, 5), ReadyPrefill(1, 64, 8, whole=True)], m, quota=1.0)
    assert planned == [PlannedChunk(0, 0, 5)]
    # first and over the quota (or the token cap): alone and whole
    assert plan_batch([ReadyPrefill(0, 64, 30, whole=True), ReadyPrefill(1, 0, 1)], m, quota=1.0,
                      max_tokens=16) == [PlannedChunk(0, 64, 30)]


def test_balanced_quota_cuts_the_heavy_gpu_to_the_target():
    from shared.sched.policy import balanced_quota
    times = [0.30, 0.10, 0.10, 0.10]
    c = balanced_quota(times, 1.05)
    mean = sum(min(t, c) for t in times) / len(times)
    assert c / mean == pytest.approx(1.05)
    assert 0.10 < c < 0.11
    assert balanced_quota([0.2, 0.19], 1.05) == 0.2  # already within: nothing is cut
    assert balanced_quota([], 1.05) == 0.0
    assert balanced_quota([0.3] + [0.01] * 15, 1.0) == 0.01  # target 1: every GPU at the smallest


def test_balanced_quota_is_the_largest_budget_within_the_target():
    from hypothesis import given, settings, strategies as st

    from shared.sched.policy import balanced_quota

    @settings(max_examples=400, deadline=None)
    @given(st.lists(st.floats(1e-6, 1.0), min_size=1, max_size=32), st.floats(1.0, 1.5))
    def check(times, target):
        c = balanced_quota(times, target)
        assert min(times) <= c <= max(times)
        ratio = lambda cap: cap * len(times) / sum(min(t, cap) for t in times)  # noqa: E731
        assert ratio(c) <= target * (1 + 1e-9)
        if c < max(times):  # a larger budget would break the target
            assert ratio(c * (1 + 1e-6)) > target * (1 - 1e-9)

    check()


def test_balanced_quota_ignores_idle_gpus():
    from shared.sched.policy import balanced_quota
    assert balanced_quota([0.0, 0.1, 0.3], 1.2) == balanced_quota([0.1, 0.3], 1.2) == 0.12 / 0.8
    assert balanced_quota([0.0, 0.0], 1.2) == 0.0


@pytest.mark.parametrize(("times", "quota"), [
    ([1.0, 0.3], 1.0),  # max/avg exactly the target: nothing is cut
    ([0.5, 2.5, 4.0], 2.5),  # cutting 4.0 to 2.5 lands exactly on the target
    ([0.5, 0.7, 4.0], 0.7),
])
def test_balanced_quota_on_a_breakpoint_is_exact(times, quota):
    from shared.sched.policy import balanced_quota
    target = quota * len(times) / sum(min(t, quota) for t in times)
    assert balanced_quota(times, target) == quota


def test_balanced_quota_when_rounding_leaves_no_room():
    from shared.sched.policy import balanced_quota
    # 3c <= 1.5 * (0.787 + c) gives c = 0.787 exactly; rounding carries the search to k = 1 with no room left
    assert balanced_quota([1e-20, 0.7872074792269987, 3.39659627811526], 1.5) == 0.7872074792269987


def test_balanced_quota_below_one_cuts_every_gpu_to_the_smallest():
    from shared.sched.policy import balanced_quota
    assert balanced_quota([0.4, 0.2, 0.3], 0.9) == 0.2  # max/avg < 1 is out of reach
    assert balanced_quota([0.4], 0.9) == 0.4


@pytest.mark.parametrize("hi,align", [(4096, 64), (1000, 7), (100, 1)])
def test_when_no_unit_fits_the_chunk_search_only_halves_down(hi, align):
    """Nothing fits (a huge first request): the whole is priced twice, then floor(log2(units + 1)) probes."""
    out = plan_batch([ReadyPrefill(1, 0, hi)], M, quota=1e-12, align=align)
    assert [c.bsz for c in out] == [min(align, hi)]
    assert Counted.calls == 2 + (hi // align + 1).bit_length() - 1


def test_pair_counts_are_exact_integers_rounded_once():
    b = 2**28 + 1  # b * (b + 1) / 2 is past float precision: halving a float would round it twice
    exact = float(4 * b + b * (b + 1) // 2)
    assert AttentionModel(per_pair=1.0).request_time(4, b) == exact
    assert AttentionModel(per_capped_pair=1.0, cap=2**29).request_time(4, b) == exact  # under the cap


def test_no_new_tokens_cost_nothing_even_at_an_unbounded_rate():
    m = AttentionModel(per_pair=math.inf, per_token=math.inf)
    assert m.request_time(7, 0) == 0.0
    assert m.batch_time([(7, 0), (0, 1)]) == math.inf


def test_a_max_tokens_budget_used_up_exactly_ends_the_batch():
    work = [ReadyPrefill(1, 0, 30), ReadyPrefill(2, 0, 10)]
    assert plan_batch(work, LINEAR, quota=1000.0, max_tokens=30) == [PlannedChunk(1, 0, 30)]


def test_a_max_tokens_of_one_is_a_cap_of_one_token():
    assert plan_batch([ReadyPrefill(1, 0, 5)], LINEAR, quota=100.0, max_tokens=1) == [PlannedChunk(1, 0, 1)]


def test_a_request_with_no_room_left_is_not_planned_as_an_empty_chunk():
    work = [ReadyPrefill(1, 0, 10), ReadyPrefill(2, 0, 10)]
    assert plan_batch(work, LINEAR, quota=10.5, align=4) == [PlannedChunk(1, 0, 10)]


def test_a_whole_request_that_exactly_fills_the_quota_behind_another_is_taken():
    work = [ReadyPrefill(1, 0, 4), ReadyPrefill(2, 0, 6, whole=True), ReadyPrefill(3, 0, 1)]
    assert plan_batch(work, LINEAR, quota=10.0) == [PlannedChunk(1, 0, 4), PlannedChunk(2, 0, 6)]
