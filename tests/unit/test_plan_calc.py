"""Planner calculations: attention layouts, MoE, capacity, CP, PP chunk split (P/D window and
stage split: test_plan_pd_window.py, test_plan_pp_split.py)."""
from __future__ import annotations

import math

import pytest

from dualpath.plan import attention, capacity, cp, moe, pp
from dualpath.presets import load_arch

pytestmark = pytest.mark.unit


def test_attention_mla_layouts_follow_spec_formulas():
    arch = load_arch("ds-v3")
    plan = attention.plan_attention(arch, attention.AttnInputs(cards=32, batch=256, ctx=8192))
    assert [x.tp for x in plan.layouts] == [1, 2, 4, 8, 16, 32]
    kv_b = 61 * 576
    for x in plan.layouts:
        assert x.kv_copies == x.tp
        assert x.kv_bytes_per_card == pytest.approx(256 / x.dp * 8192 * kv_b)
        assert x.weight_bytes_per_card == pytest.approx(plan.attn_weight_bytes / x.tp)
        assert x.layout_comm_bd == pytest.approx(2 * (x.tp - 1) / x.tp / x.dp)
    assert len({x.moe_a2a_bd for x in plan.layouts}) == 1
    assert plan.layouts[0].layout_comm_bd == 0
    assert plan.tp_star == pytest.approx(math.sqrt(plan.attn_weight_bytes * 32 / plan.kv_total_bytes))
    assert plan.recommended_tp == 2  # nearest divisor to the sqrt-rule optimum ~2.2


def test_attention_short_context_leans_to_tp_long_to_dp():
    arch = load_arch("ds-v3")
    short = attention.plan_attention(arch, attention.AttnInputs(32, 64, 512))
    long = attention.plan_attention(arch, attention.AttnInputs(32, 256, 65536))
    assert short.recommended_tp > long.recommended_tp == 1


def test_attention_gqa_splits_kv_until_heads_run_out():
    arch = load_arch("qwen2.5-32b")
    plan = attention.plan_attention(arch, attention.AttnInputs(16, 64, 4096, kv_dtype="bf16"))
    by_tp = {x.tp: x for x in plan.layouts}
    assert by_tp[8].kv_copies == 1 and by_tp[16].kv_copies == 2 and not by_tp[16].allowed
    assert by_tp[1].kv_bytes_per_card == pytest.approx(by_tp[8].kv_bytes_per_card)
    assert plan.recommended_tp == 8 and plan.tp_star == 8


def test_moe_ratio_tile_fill_and_experts_hit():
    arch = load_arch("ds-v3")
    p = moe.plan_moe(arch, moe.MoEInputs(ep=32, batch=256))
    assert p.comm_ratio == 0.25 and p.tp_tile_fill == 0.5 and p.ep_tile_fill == 1.0
    assert p.experts_hit == pytest.approx(256 * (1 - math.exp(-256 * 8 / 256)))
    assert p.rows_per_expert == 8 and p.act_bytes_per_card_ep * 32 == p.act_bytes_per_card_tp
    assert moe.plan_moe(arch, moe.MoEInputs(ep=8, batch=1)).comm_ratio == 1
    assert moe.tile_fill(200, 128) == pytest.approx(200 / 256)
    with pytest.raises(ValueError, match="dense"):
        moe.plan_moe(load_arch("llama-3-70b"), moe.MoEInputs(8, 8))


def test_capacity_counts_weights_and_kv():
    arch = load_arch("ds-v3")
    c = capacity.plan_capacity(arch, capacity.CapInputs(cards=32, hbm_gb=80, ctx=8192))
    assert c.weights_by_part["routed_experts"] == pytest.approx(arch.params().routed_experts * (1 + 4 / 128**2) / 32)
    assert c.usable == pytest.approx(80e9 - c.weights_per_card - 4e9 - 4e9)
    assert c.kv_per_request == 8192 * 61 * 576
    assert c.b_memory == int(c.usable / c.kv_per_request) * 32 == c.b_run
    tp2 = capacity.plan_capacity(arch, capacity.CapInputs(32, 80, 8192, attn_tp=2, b_slo=100))
    assert tp2.b_run == 100 and tp2.kv_per_request == c.kv_per_request  # MLA: copy per rank
    small = capacity.plan_capacity(arch, capacity.CapInputs(cards=8, hbm_gb=80, ctx=8192))
    assert not small.fits and small.b_memory == 0
    with pytest.raises(ValueError, match="does not divide"):
        capacity.CapInputs(cards=6, hbm_gb=80, ctx=10, attn_tp=4)


def test_cp_routes_limits_and_balance():
    q = cp.plan_cp(load_arch("qwen2.5-32b"), cp.CPInputs(cards=8, seq=65536))
    by = {r.name: r for r in q.routes}
    assert by["ulysses"].comm_elems == pytest.approx(by["ring"].comm_elems * 2 / 8)
    assert by["all-gather"].act_elems == 8 * by["ring"].act_elems
    assert q.recommended == "ulysses" and q.partition == "zigzag"
    assert q.dcp.max_degree == 1  # GQA: TP 8 / n_kv 8
    bal = {b.scheme: b.max_over_mean for b in q.balance}
    assert bal["contiguous"] > 1.8 and bal["zigzag"] == pytest.approx(1.0)
    d = cp.plan_cp(load_arch("ds-v3.2-660b"), cp.CPInputs(cards=8, seq=8192))
    assert d.recommended == "ring" and d.partition == "interleave" and d.dcp.max_degree == 8
    assert cp.plan_cp(load_arch("llama-3-70b"), cp.CPInputs(4, 64, tp=16)).dcp.max_degree == 2
    assert not cp.plan_cp(load_arch("qwen2.5-32b"), cp.CPInputs(16, 64)).routes[1].allowed


def test_cp_causal_work_matches_pair_count():
    for scheme in cp.SCHEMES:
        w = cp.causal_work(1000, 7, scheme)
        assert sum(w) == 1000 * 1001 // 2


def test_pp_chunk_splits():
    eq, sq, exact = pp.chunk_splits(32768, 8, 1.0)
    assert sq.bounds == tuple(round(32768 * math.sqrt(k / 8)) for k in range(9))
    assert sq.max_over_mean == pytest.approx(1.0, abs=1e-3)  # a = 1: sqrt is equal-time
    assert eq.times[0] == pytest.approx(1 / 8) and eq.times[-1] == pytest.approx(15 / 8)
    mixed = pp.chunk_splits(32768, 8, 0.6)
    assert mixed[2].max_over_mean == pytest.approx(1.0, abs=1e-3)
    assert mixed[2].max_over_mean < mixed[1].max_over_mean
    assert sum(mixed[2].sizes) == 32768
