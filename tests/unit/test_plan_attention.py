"""Attention TP x DP layouts in exact figures: per-card KV, read bandwidth, traffic, GQA limits."""
from __future__ import annotations

import dataclasses
import re

import pytest

from dualpath.plan import attention
from dualpath.presets import load_arch

pytestmark = pytest.mark.unit

_DS_KV_FP8 = 61 * 576  # bytes per token, MLA latent + rope, fp8


def test_mla_layouts_exact():
    arch = load_arch("ds-v3")
    plan = attention.plan_attention(arch, attention.AttnInputs(cards=4, batch=8, ctx=1024))
    assert (plan.model, plan.mla, plan.kv_bytes_per_token) == ("ds-v3", True, _DS_KV_FP8)
    assert plan.kv_total_bytes == 8 * 1024 * _DS_KV_FP8
    w = plan.attn_weight_bytes
    for lay in plan.layouts:
        t, p = lay.tp, 4 // lay.tp
        kv = 8 / p * 1024 * _DS_KV_FP8  # MLA: every TP rank holds its requests' whole latent
        assert type(lay.dp) is int and lay.dp == p
        assert lay.kv_bytes_per_card == kv
        assert lay.kv_read_gbs == pytest.approx(kv / 0.050 / 1e9, rel=1e-12)  # tpot 50 ms
        assert lay.total_bytes_per_card == pytest.approx(w / t + kv, rel=1e-12)
        assert lay.moe_a2a_bd == 2 * 8 * (3 / 4) / 4  # k = 8 experts per token over 4 cards
        assert lay.attn_tokens_per_card == 8 / p
        assert (lay.allowed, lay.note) == (True, "")


def test_dense_gqa_has_no_moe_traffic_and_notes_replication():
    plan = attention.plan_attention(load_arch("smollm2-135m"), attention.AttnInputs(4, 8, 1024, tpot_ms=0.5))
    assert plan.mla is False and plan.tp_star == 3.0  # n_kv = 3
    by = {lay.tp: lay for lay in plan.layouts}
    assert all(lay.moe_a2a_bd == 0.0 for lay in plan.layouts)
    assert by[1].allowed and by[1].note == ""
    for t in (2, 4):  # 2 does not divide n_kv = 3; 4 exceeds it
        assert not by[t].allowed and by[t].note == "TP > n_kv=3: KV heads replicated"
    assert by[1].kv_read_gbs == pytest.approx(by[1].kv_bytes_per_card / 0.0005 / 1e9, rel=1e-12)
    assert plan.recommended_tp == 1


def test_a_dense_model_has_no_moe_traffic_whatever_its_top_k_says():
    arch = dataclasses.replace(load_arch("llama-3-70b"), experts_per_token=8)  # no routed experts
    plan = attention.plan_attention(arch, attention.AttnInputs(8, 8, 1024))
    assert [lay.moe_a2a_bd for lay in plan.layouts] == [0.0] * 4


def test_near_best_keeps_layouts_within_ten_percent():
    plan = attention.plan_attention(load_arch("ds-v3"), attention.AttnInputs(32, 64, 4096))
    totals = {lay.tp: lay.total_bytes_per_card for lay in plan.layouts}
    assert plan.recommended_tp == 8 and plan.near_best_tps == (4, 8)
    assert 1.0 < totals[4] / totals[8] < 1.1 < totals[16] / totals[8] < 2.1


def test_near_best_includes_a_layout_at_exactly_ten_percent():
    # inputs found so that tp=1's total is exactly 1.1 x tp=2's in floating point
    plan = attention.plan_attention(
        load_arch("qwen2.5-32b"), attention.AttnInputs(2, 1, 553023, kv_dtype="fp8", weight_dtype="bf16"))
    t1, t2 = (lay.total_bytes_per_card for lay in plan.layouts)
    assert t1 == 1.1 * t2
    assert plan.recommended_tp == 2 and plan.near_best_tps == (1, 2)


@pytest.mark.parametrize(("kwargs", "msg"), [
    ({"cards": 0, "batch": 1, "ctx": 1}, "cards must be > 0, got 0"),
    ({"cards": 1, "batch": 1, "ctx": 0}, "ctx must be > 0, got 0"),
    ({"cards": 1, "batch": 1, "ctx": 1, "tpot_ms": -2.5}, "tpot_ms must be > 0, got -2.5"),
])
def test_bad_inputs_name_the_value(kwargs, msg):
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        attention.AttnInputs(**kwargs)
