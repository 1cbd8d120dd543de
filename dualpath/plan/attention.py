"""Attention TP x DP layouts of P cards (docs/concepts/parallelism.md#attention-tp-or-dp).

Per card: KV copies and bytes, attention weights W/t and the layout-change traffic; MLA's
memory is least at t* = sqrt(W * P / KV_total).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from dualpath.plan.dtypes import attention_weight_bytes, dtype_bytes
from dualpath.presets import ModelArch


@dataclass(frozen=True)
class AttnInputs:
    cards: int  # P
    batch: int  # B, global decode batch (requests)
    ctx: int  # context length per request
    kv_dtype: str = "fp8"
    weight_dtype: str = "fp8"
    tpot_ms: float = 50.0  # decode step time used to turn KV reads into bandwidth

    def __post_init__(self) -> None:
        for name in ("cards", "batch", "ctx", "tpot_ms"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class AttentionLayout:
    tp: int
    dp: int
    kv_copies: float
    kv_bytes_per_card: float  # also the KV bytes each card reads per decode step
    kv_read_gbs: float  # that read at one step per tpot_ms
    weight_bytes_per_card: float  # attention projection weights
    total_bytes_per_card: float  # weights + KV
    layout_comm_bd: float  # per card per layer, units of B*d elements
    moe_a2a_bd: float  # per card per layer, units of B*d elements (same for all)
    attn_tokens_per_card: float  # B/p: tokens each card runs attention for
    allowed: bool  # GQA: tp <= n_kv and divides it (or is a multiple of it)
    note: str


@dataclass(frozen=True)
class AttnPlan:
    model: str
    mla: bool
    inputs: AttnInputs
    kv_bytes_per_token: float
    kv_total_bytes: float
    attn_weight_bytes: float
    tp_star: float  # sqrt rule (MLA); the GQA limit n_kv for GQA
    recommended_tp: int
    near_best_tps: tuple[int, ...]  # layouts within 10% of the best weights+KV
    layouts: tuple[AttentionLayout, ...]


def divisors(n: int) -> list[int]:
    return [i for i in range(1, n + 1) if n % i == 0]


def kv_copies(arch: ModelArch, t: int) -> float:
    return float(t) if arch.is_mla else t / min(t, arch.num_kv_heads)


def _gqa_allowed(arch: ModelArch, t: int) -> bool:
    if arch.is_mla:
        return True
    return t <= arch.num_kv_heads and arch.num_kv_heads % t == 0


def _layout(arch: ModelArch, inp: AttnInputs, t: int, kv_b: float, w: float) -> AttentionLayout:
    p = inp.cards // t
    copies = kv_copies(arch, t)
    kv = inp.batch / p * inp.ctx * kv_b * copies / t
    c_all = (inp.cards - 1) / inp.cards
    k = arch.experts_per_token
    note = "" if _gqa_allowed(arch, t) else f"TP > n_kv={arch.num_kv_heads}: KV heads replicated"
    return AttentionLayout(
        tp=t, dp=p, kv_copies=copies, kv_bytes_per_card=kv,
        kv_read_gbs=kv / (inp.tpot_ms / 1e3) / 1e9,
        weight_bytes_per_card=w / t, total_bytes_per_card=w / t + kv,
        layout_comm_bd=2 * (t - 1) / t / p,
        moe_a2a_bd=2 * k * c_all / inp.cards if arch.is_moe else 0.0,
        attn_tokens_per_card=inp.batch / p, allowed=_gqa_allowed(arch, t), note=note,
    )


def plan_attention(arch: ModelArch, inp: AttnInputs) -> AttnPlan:
    kv_b = arch.kv_bytes_per_token(dtype_bytes(inp.kv_dtype))
    w = attention_weight_bytes(arch, inp.weight_dtype)
    kv_total = inp.batch * inp.ctx * kv_b
    layouts = tuple(_layout(arch, inp, t, kv_b, w) for t in divisors(inp.cards))
    ok = [lay for lay in layouts if lay.allowed]
    best = min(ok, key=lambda lay: (lay.total_bytes_per_card, lay.tp))
    near = tuple(lay.tp for lay in ok if lay.total_bytes_per_card <= 1.1 * best.total_bytes_per_card)
    t_star = math.sqrt(w * inp.cards / kv_total) if arch.is_mla else float(arch.num_kv_heads)
    return AttnPlan(arch.name, arch.is_mla, inp, kv_b, kv_total, w, t_star, best.tp, near, layouts)
