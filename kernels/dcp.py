"""Decode context parallelism (DCP): KV sharded along the sequence, merged by LSE."""
from __future__ import annotations

import torch
from torch import Tensor

from kernels import attention as attn
from kernels import decode
from kernels.lse_merge import merge_stacked


def shard_positions(seq: int, n: int, device=None) -> list[Tensor]:
    if n < 1:
        raise ValueError(f"DCP degree must be >= 1, got {n}")
    return [torch.arange(seq, device=device)[r::n] for r in range(n)]


def shard(x: Tensor, n: int) -> list[Tensor]:
    return [x[r::n] for r in range(n)]


def home(position: int, n: int) -> tuple[int, int]:
    return position % n, position // n


def shard_partial(q: Tensor, k_shard: Tensor, v_shard: Tensor, rank: int, n: int, seq: int,
                  *, scale: float | None = None) -> tuple[Tensor, Tensor]:
    """One card's step: q (Tq, H, D) over its shard -> (out (H, Tq, Dv) fp32, lse (H, Tq))."""
    k_pos = torch.arange(seq, device=q.device)[rank::n]  # (T_r,); empty when rank >= seq
    q_pos = torch.arange(seq - q.shape[0], seq, device=q.device)  # (Tq,)
    out, lse = attn.attention(q.transpose(0, 1)[None], k_shard.transpose(0, 1)[None],
                              v_shard.transpose(0, 1)[None], causal=True, scale=scale,
                              q_pos=q_pos, k_pos=k_pos, fp32_out=True)
    return out[0], lse[0]


def dcp_attention(q: Tensor, k_shards: list[Tensor], v_shards: list[Tensor], *,
                  scale: float | None = None) -> tuple[Tensor, Tensor]:
    """Merge all shards' partials: (out (Tq, H, Dv), lse (Tq, H))."""
    n = len(k_shards)
    seq = sum(int(k.shape[0]) for k in k_shards)
    parts = [shard_partial(q, k_shards[r], v_shards[r], r, n, seq, scale=scale) for r in range(n)]
    out, lse = merge_stacked(torch.stack([o for o, _ in parts]), torch.stack([s for _, s in parts]))
    return out.to(q.dtype).transpose(0, 1), lse.transpose(0, 1)


reference = decode.reference  # unsharded attention is the oracle and the fallback
