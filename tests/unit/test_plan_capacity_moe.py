"""Capacity and MoE plans in exact figures: per-card weights, KV + state per request, batch limits,
MoE traffic, tile fill and expert reads, and the input errors the CLI shows."""
from __future__ import annotations

import math
import re

import pytest

from dualpath.plan import capacity, moe
from dualpath.plan.dtypes import linear_bytes, part_bytes
from dualpath.presets import load_arch

pytestmark = pytest.mark.unit


def test_capacity_sparse_tp2_with_state_exact():
    arch = load_arch("ds-v3.2-660b")
    c = capacity.plan_capacity(arch, capacity.CapInputs(32, 80, 8192, attn_tp=2, state_mb=1.5))
    full = part_bytes(arch.params(), "fp8")
    split = {"routed_experts": 32, "attention": 2, "dense_mlp": 2, "shared_experts": 2}
    assert c.model == "ds-v3.2-660b"
    assert c.weights_by_part == {k: b / split.get(k, 1) for k, b in full.items()}  # router etc. whole
    assert (c.buffers, c.margin, c.state_per_request) == (4e9, 0.05 * 80e9, 1.5e6)
    per_token = 61 * 576 + arch.index_bytes_per_token(1.0)  # latent + indexer keys, fp8
    assert arch.index_bytes_per_token(1.0) > 0
    assert c.kv_per_request == 8192 * per_token  # MLA: each TP rank holds the whole latent
    assert c.b_memory_per_group == pytest.approx(c.usable / (c.kv_per_request + 1.5e6), rel=1e-12)
    assert type(c.b_memory) is int and c.b_memory == int(c.b_memory_per_group) * 16 == c.b_run


def test_capacity_limits_batch_by_slo_and_concurrency():
    arch = load_arch("ds-v3")
    one = capacity.plan_capacity(arch, capacity.CapInputs(32, 80, 8192, b_slo=1))
    assert one.b_run == 1 < one.b_memory
    conc = capacity.plan_capacity(arch, capacity.CapInputs(32, 80, 8192, b_slo=500, concurrency=7))
    assert conc.b_run == 7


def test_capacity_that_does_not_fit_holds_nothing():
    c = capacity.plan_capacity(load_arch("ds-v3"), capacity.CapInputs(cards=8, hbm_gb=80, ctx=8192))
    assert c.usable < 0 and not c.fits
    assert (c.b_memory_per_group, c.b_memory, c.b_run) == (0.0, 0, 0)


@pytest.mark.parametrize(("kwargs", "msg"), [
    ({"cards": 8, "hbm_gb": 0, "ctx": 1}, "hbm_gb must be > 0, got 0"),
    ({"cards": 8, "hbm_gb": 80, "ctx": 1, "attn_tp": 0}, "attn_tp must be > 0, got 0"),
    ({"cards": 8, "hbm_gb": 80, "ctx": 1, "attn_tp": 3}, "attn_tp 3 does not divide cards 8"),
    ({"cards": 8, "hbm_gb": 80, "ctx": 1, "margin": 1.0}, "margin must be in [0, 1), got 1.0"),
    ({"cards": 8, "hbm_gb": 80, "ctx": 1, "margin": 1.5}, "margin must be in [0, 1), got 1.5"),
    ({"cards": 8, "hbm_gb": 80, "ctx": 1, "margin": -0.1}, "margin must be in [0, 1), got -0.1"),
])
def test_capacity_bad_inputs_name_the_value(kwargs, msg):
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        capacity.CapInputs(**kwargs)


def test_capacity_margin_zero_is_allowed():
    c = capacity.plan_capacity(load_arch("ds-v3"), capacity.CapInputs(32, 80, 8192, margin=0.0))
    assert c.margin == 0.0 and c.usable == 80e9 - c.weights_per_card - 4e9


def test_moe_plan_exact():
    p = moe.plan_moe(load_arch("ds-v3"), moe.MoEInputs(ep=8, batch=64))  # E 256, k 8, N 2048, d 7168
    u = 256 * (1 - math.exp(-64 * 8 / 256))
    expert = 3 * 7168 * 2048 * linear_bytes("fp8")
    act = 64 * 8 * 7168 * 2.0
    assert (p.model, p.experts, p.top_k, p.n_inter) == ("ds-v3", 256, 8, 2048)
    assert (p.comm_ratio, p.tp_n_per_card, p.tp_tile_fill, p.ep_tile_fill) == (1.0, 256.0, 1.0, 1.0)
    assert p.experts_hit == pytest.approx(u, rel=1e-12)
    assert p.experts_hit_per_card_ep == pytest.approx(u / 8, rel=1e-12)
    assert p.experts_per_card_ep == 32.0
    assert p.expert_read_bytes_per_card == pytest.approx(u * expert / 8, rel=1e-12)
    assert (p.act_bytes_per_card_tp, p.act_bytes_per_card_ep) == (act, act / 8)
    assert (p.rows_per_expert, p.tokens_per_card) == (2.0, 8.0)
    assert p.ep_for_full_m_tile == 128 * 256 / (8 * 8)


@pytest.mark.parametrize(("n", "fill"), [(-1, 0.0), (0, 0.0), (1, 1 / 128), (128, 1.0), (129, 129 / 256)])
def test_tile_fill(n, fill):
    assert moe.tile_fill(n, 128) == fill


@pytest.mark.parametrize(("kwargs", "msg"), [
    ({"ep": 0, "batch": 1}, "ep must be > 0, got 0"),
    ({"ep": 8, "batch": 1, "block_m": 0}, "block_m must be > 0, got 0"),
])
def test_moe_bad_inputs_name_the_value(kwargs, msg):
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        moe.MoEInputs(**kwargs)


def test_moe_dense_model_message():
    with pytest.raises(ValueError, match="^llama-3-70b is a dense model: it has no routed experts$"):
        moe.plan_moe(load_arch("llama-3-70b"), moe.MoEInputs(8, 8))
