"""Pipeline stage split: the slowest stage is as fast as any split of the layers allows.

Reference: `best[j][m]`, the least largest count over every split of m layers into j
non-empty stages (a DP over each stage's count, so no split is skipped), itself checked
against listing every split up to 14 layers. Grid: layers 1..64, stages 1..8, 12 tails.
"""
from __future__ import annotations

import itertools
import math
import re

import pytest

from dualpath.plan import pp

pytestmark = pytest.mark.unit

MAX_LAYERS, MAX_STAGES = 64, 8
TAILS = (0.0, 0.05, 0.1, 0.2, 0.25, 0.3, 1 / 3, 0.5, 0.6, 0.75, 0.8, 0.99)


def best_counts(max_layers: int, max_stages: int) -> list[list[float]]:
    """best[j][m]: least max stage count over all splits of m layers into j non-empty stages."""
    best = [[math.inf] * (max_layers + 1) for _ in range(max_stages + 1)]
    best[0][0] = 0
    for j in range(1, max_stages + 1):
        for m in range(j, max_layers + 1):
            best[j][m] = min(max(best[j - 1][m - n], n) for n in range(1, m - j + 2))
    return best


BEST = best_counts(MAX_LAYERS, MAX_STAGES)


def optimum(layers: int, stages: int, tail: float) -> float:
    """Least slowest-stage time over every split, the last stage carrying tail * L/p."""
    extra = tail * layers / stages
    return min(max(BEST[stages - 1][layers - n], n + extra)
               for n in range(1, layers - stages + 2))


def brute_force(layers: int, stages: int, tail: float) -> float:
    """The same optimum by listing every composition (cut points between layers)."""
    extra = tail * layers / stages
    out = math.inf
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        counts = [b - a for a, b in zip((0, *cuts), (*cuts, layers))]
        out = min(out, max(max(counts[:-1], default=0), counts[-1] + extra))
    return out


@pytest.mark.parametrize("tail", TAILS)
def test_dp_reference_equals_enumerating_every_composition(tail):
    for layers in range(1, 15):
        for stages in range(1, min(layers, MAX_STAGES) + 1):
            assert optimum(layers, stages, tail) == brute_force(layers, stages, tail)


@pytest.mark.parametrize("tail", TAILS)
def test_stage_split_is_optimal_for_every_layer_and_stage_count(tail):
    for layers in range(1, MAX_LAYERS + 1):
        for stages in range(1, min(layers, MAX_STAGES) + 1):
            s = pp.stage_split(layers, stages, tail)
            assert sum(s.layers) == layers and min(s.layers) >= 1 and len(s.layers) == stages
            assert max(s.times) == pytest.approx(optimum(layers, stages, tail), abs=1e-9), \
                (layers, stages, tail, s.layers)
            assert s.max_over_mean <= s.naive_max_over_mean + 1e-12


def test_tail_stage_gets_fewer_layers_and_beats_the_share_formula():
    s = pp.stage_split(61, 4, tail=0.5)
    assert s.layers == (17, 17, 17, 10)
    assert s.times == (17.0, 17.0, 17.0, 17.625)
    # the last-stage share formula, (L/p)(1-beta) = 7.625 -> 8 layers, leaves 53 for three
    # stages: 17/18/18, so its slowest stage takes 18 layer units
    assert max(s.times) < 18 and s.max_over_mean < s.naive_max_over_mean


def test_ties_go_to_middle_stages_and_keep_the_first_light():
    assert pp.stage_split(80, 8).layers == (10,) * 8
    assert pp.stage_split(61, 4).layers == (15, 15, 16, 15)
    assert pp.stage_split(62, 4).layers == (15, 16, 16, 15)
    assert pp.stage_split(63, 4).layers == (15, 16, 16, 16)


def test_min_max_split_honours_an_extra_on_any_stage():
    assert pp.min_max_split(12, [3.0, 0.0, 0.0]) == (2, 5, 5)
    assert pp.min_max_split(3, [0.0, 9.0, 0.0]) == (1, 1, 1)


def test_stage_split_rejects_bad_shapes():
    with pytest.raises(ValueError, match="stages"):
        pp.stage_split(3, 4)
    with pytest.raises(ValueError, match="tail"):
        pp.stage_split(8, 2, tail=1.0)
    with pytest.raises(ValueError, match="stages"):
        pp.min_max_split(2, [])


def test_stage_split_ratios_against_the_even_split():
    s = pp.stage_split(61, 4, tail=0.5)  # even split 15/15/16/15 + tail 7.625 on the last stage
    mean = (17 * 3 + 17.625) / 4
    assert s.max_over_mean == 17.625 / mean and s.naive_max_over_mean == 22.625 / mean
    assert pp.stage_split(61, 4).naive_max_over_mean == 16 / 15.25  # one extra layer, one stage
    assert pp.stage_split(60, 4).naive_max_over_mean == 1.0  # no remainder: no stage gets more


@pytest.mark.parametrize(("layers", "stages"), [(8, 0), (3, 4)])
def test_stage_split_names_the_bad_shape(layers, stages):
    with pytest.raises(ValueError, match=f"^need 1 <= stages <= layers, got stages={stages} layers={layers}$"):
        pp.stage_split(layers, stages)


def test_chunk_split_names_and_edges():
    assert [c.name for c in pp.chunk_splits(10, 2, 0.5)] == ["equal", "sqrt", "equal-time"]
    one = pp.chunk_splits(10, 1, 0.5)
    assert all(c.bounds == (0, 10) and c.max_over_mean == 1.0 for c in one)
    assert pp.chunk_splits(4, 4, 0.0)[0].sizes == (1, 1, 1, 1)
    assert pp.chunk_splits(100, 2, 1.0)[2].bounds == (0, 71, 100)  # a = 1: s_k = T*sqrt(k/m)


@pytest.mark.parametrize("share", [0.0, 1e-12, 1e-11, 1e-6])
def test_equal_time_split_with_little_attention_is_the_equal_split(share):
    eq, _, exact = pp.chunk_splits(10**6, 4, share)
    assert exact.bounds == eq.bounds == (0, 250_000, 500_000, 750_000, 1_000_000)
    assert exact.max_over_mean == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize(("args", "msg"), [
    ((10, 0, 0.5), "need 1 <= chunks <= seq, got chunks=0 seq=10"),
    ((3, 4, 0.5), "need 1 <= chunks <= seq, got chunks=4 seq=3"),
    ((10, 2, -0.1), "attention share must be in [0, 1], got -0.1"),
    ((10, 2, 1.5), "attention share must be in [0, 1], got 1.5"),
])
def test_chunk_splits_name_the_bad_input(args, msg):
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        pp.chunk_splits(*args)
