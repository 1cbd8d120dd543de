"""MoE-TP vs MoE-EP over one domain of P cards (docs/concepts/parallelism.md#moe-tp-or-ep).

Traffic ratio r = k / P, tile fill, experts hit u(B) = E * (1 - exp(-B*k/E)), rows per
expert and activation per card.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from dualpath.plan.dtypes import dtype_bytes, linear_bytes
from dualpath.presets import ModelArch


@dataclass(frozen=True)
class MoEInputs:
    ep: int  # P, the MoE domain size (TP degree for the MoE-TP column)
    batch: int  # B, tokens per step in the domain
    block_n: int = 128  # BN, GEMM tile width along N
    block_m: int = 128  # BM, GEMM tile height along M (rows per expert)
    weight_dtype: str = "fp8"
    act_dtype: str = "bf16"

    def __post_init__(self) -> None:
        for name in ("ep", "batch", "block_n", "block_m"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class MoEPlan:
    model: str
    inputs: MoEInputs
    experts: int  # E
    top_k: int  # k
    n_inter: int  # N
    comm_ratio: float  # r = k / P
    tp_n_per_card: float  # N / P
    tp_tile_fill: float  # fraction of BN-wide tiles filled under MoE-TP
    ep_tile_fill: float  # under MoE-EP (whole N)
    experts_hit: float  # u(B)
    experts_hit_per_card_ep: float  # u(B) / P: of the E/P experts a card holds
    experts_per_card_ep: float  # E / P
    expert_read_bytes_per_card: float  # per MoE layer, same expectation TP and EP
    act_bytes_per_card_tp: float  # [B*k, d] per MoE layer
    act_bytes_per_card_ep: float  # [B*k/P, d]
    rows_per_expert: float  # M_e
    ep_for_full_m_tile: float  # P ~ BM*E/(k*B_local): EP size whose M_e fills BM
    tokens_per_card: float  # B_local


def tile_fill(n: float, block: int) -> float:
    """Useful fraction of ceil(n / block) tiles of width `block`."""
    if n <= 0:
        return 0.0
    return n / (math.ceil(n / block) * block)


def experts_hit(tokens: float, k: int, experts: int) -> float:
    """u(B) = E * (1 - exp(-B*k/E)): expected distinct experts with >= 1 token."""
    return experts * (1.0 - math.exp(-tokens * k / experts))


def plan_moe(arch: ModelArch, inp: MoEInputs) -> MoEPlan:
    if not arch.is_moe:
        raise ValueError(f"{arch.name} is a dense model: it has no routed experts")
    e, k, n, d, p = arch.n_routed_experts, arch.experts_per_token, arch.moe_intermediate, arch.hidden, inp.ep
    u = experts_hit(inp.batch, k, e)
    expert_bytes = 3 * d * n * linear_bytes(inp.weight_dtype)
    act = inp.batch * k * d * dtype_bytes(inp.act_dtype)
    b_local = inp.batch / p
    return MoEPlan(
        model=arch.name, inputs=inp, experts=e, top_k=k, n_inter=n,
        comm_ratio=k / p, tp_n_per_card=n / p,
        tp_tile_fill=tile_fill(n / p, inp.block_n), ep_tile_fill=tile_fill(n, inp.block_n),
        experts_hit=u, experts_hit_per_card_ep=u / p, experts_per_card_ep=e / p,
        expert_read_bytes_per_card=u * expert_bytes / p,
        act_bytes_per_card_tp=act, act_bytes_per_card_ep=act / p,
        rows_per_expert=inp.batch * k / e,
        ep_for_full_m_tile=inp.block_m * e / (k * b_local),
        tokens_per_card=b_local,
    )
