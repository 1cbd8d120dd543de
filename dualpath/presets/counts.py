"""Parameter and FLOP counts derived from a model's Shapes (pure arithmetic).

Counts are elements; MLA attention FLOPs use the prefill (non-absorbed) form.
"""
from __future__ import annotations

from dataclasses import dataclass

from dualpath.presets.shapes import Shapes


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by part, counted from shapes (elements, not bytes)."""

    attention: int  # q/k/v/o projections (+ MLA LoRA and norms, + V3.2 indexer), all layers
    dense_mlp: int  # gate/up/down of the dense (non-MoE) layers
    routed_experts: int  # all routed experts of all MoE layers
    shared_experts: int  # shared experts of all MoE layers
    router: int  # MoE gate weights (+ score-correction bias)
    embeddings: int  # input embedding + lm_head (counted once when tied)
    norms: int  # per-layer input/post-attention RMSNorms + the final norm
    active_per_token: int  # what one token uses: routed experts scaled by k/E

    @property
    def total(self) -> int:
        return (self.attention + self.dense_mlp + self.routed_experts + self.shared_experts
                + self.router + self.embeddings + self.norms)

    @property
    def experts(self) -> int:
        return self.routed_experts + self.shared_experts


def _mla_attention(a: Shapes) -> int:
    d, h = a.hidden, a.num_heads
    if a.q_lora_rank:
        q = d * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * h * a.qk_head_dim
    else:
        q = d * h * a.qk_head_dim
    kv_a = d * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank  # + latent norm
    kv_b = a.kv_lora_rank * h * (a.qk_nope_head_dim + a.v_head_dim)
    o = h * a.v_head_dim * d
    return q + kv_a + kv_b + o + _indexer(a)


def _indexer(a: Shapes) -> int:
    """V3.2 lightning indexer: its own q (from the q latent), one k head, head weights."""
    if not a.index_n_heads:
        return 0
    q_in = a.q_lora_rank or a.hidden
    wq = q_in * a.index_n_heads * a.index_head_dim
    wk = a.hidden * a.index_head_dim + 2 * a.index_head_dim  # + LayerNorm weight, bias
    return wq + wk + a.hidden * a.index_n_heads


def _gqa_attention(a: Shapes) -> int:
    d, hd = a.hidden, a.head_dim
    q_out, kv_out = a.num_heads * hd, a.num_kv_heads * hd
    bias = q_out + 2 * kv_out if a.attention_bias else 0
    return d * q_out + 2 * d * kv_out + q_out * d + bias


def attention_per_layer(a: Shapes) -> int:
    return _mla_attention(a) if a.is_mla else _gqa_attention(a)


def param_counts(a: Shapes) -> ParamCounts:
    d = a.hidden
    moe_layers = a.num_moe_layers
    expert = 3 * d * a.moe_intermediate  # gate, up, down
    routed = moe_layers * a.n_routed_experts * expert
    routed_active = moe_layers * a.experts_per_token * expert
    parts = dict(
        attention=a.num_layers * attention_per_layer(a),
        dense_mlp=a.num_dense_layers * 3 * d * a.intermediate,
        routed_experts=routed,
        shared_experts=moe_layers * a.n_shared_experts * expert,
        router=moe_layers * (a.n_routed_experts * d + a.n_routed_experts),
        embeddings=a.vocab * d * (1 if a.tie_embeddings else 2),
        norms=a.num_layers * 2 * d + d,
    )
    active = sum(parts.values()) - routed + routed_active
    return ParamCounts(active_per_token=active, **parts)


def linear_flops_per_token(a: Shapes) -> float:
    """2 FLOPs per active weight, without the embedding lookup, the lm_head and the norms."""
    p = param_counts(a)
    return 2.0 * (p.active_per_token - p.embeddings - p.norms)


def _sum_min(lo: int, hi: int, cap: int) -> int:
    """sum_{j=lo}^{hi} min(j, cap) for 0 < lo <= hi (closed form)."""
    below_hi = min(hi, cap)
    s = (below_hi * (below_hi + 1) - (lo - 1) * lo) // 2 if lo <= below_hi else 0
    over = hi - max(lo - 1, cap)
    return s + (over * cap if over > 0 else 0)


def attended_pairs(cached: int, new: int, topk: int = 0) -> int:
    """(query, key) pairs of `new` causal queries after `cached` tokens, each at most `topk` if sparse."""
    if cached < 0 or new < 0:
        raise ValueError(f"cached and new must be >= 0, got ({cached}, {new})")
    if new == 0:
        return 0
    if topk <= 0:
        return new * cached + new * (new + 1) // 2
    return _sum_min(cached + 1, cached + new, topk)


def attention_flops(a: Shapes, cached: int, new: int) -> float:
    """q.k + p.v FLOPs over all layers and heads; with a V3.2 indexer, main attention sees at most
    index_topk keys and the indexer scores all."""
    per_pair = 2.0 * a.num_heads * (a.qk_head_dim + (a.v_head_dim or a.head_dim))
    flops = attended_pairs(cached, new, a.index_topk) * per_pair
    if a.index_n_heads:
        flops += attended_pairs(cached, new) * 2.0 * a.index_n_heads * a.index_head_dim
    return a.num_layers * flops
