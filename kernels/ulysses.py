"""Ulysses context parallelism: switch the split from sequence to heads and back."""
from __future__ import annotations

import torch
from torch import Tensor

from kernels import attention as attn


def seq_to_head(parts: list[Tensor]) -> list[Tensor]:
    """N x (B, H, T_r, D) -> N x (B, H/N, sum T_r, D)."""
    n, h = len(parts), parts[0].shape[1]
    if h % n:
        raise ValueError(f"Ulysses needs heads % ranks == 0, got H={h}, N={n}")
    chunks = [p.chunk(n, dim=1) for p in parts]  # [src][dst] (B, H/N, T_src, D)
    return [torch.cat([chunks[src][dst] for src in range(n)], dim=2) for dst in range(n)]


def head_to_seq(parts: list[Tensor], lengths: list[int]) -> list[Tensor]:
    """N x (B, H/N, T, D) -> N x (B, H, T_r, D)."""
    n = len(parts)
    pieces = [p.split(lengths, dim=2) for p in parts]  # [src head group][dst] (B, H/N, T_dst, D)
    return [torch.cat([pieces[src][dst] for src in range(n)], dim=1) for dst in range(n)]


def _kv_heads_for(x: Tensor, heads: int, n: int) -> Tensor:
    hkv = x.shape[1]
    return x if hkv % n == 0 else x.repeat_interleave(heads // hkv, dim=1)


def ulysses_attention(qs: list[Tensor], ks: list[Tensor], vs: list[Tensor], pos: list[Tensor], *,
                      causal: bool = True, scale: float | None = None) -> list[Tensor]:
    n, h = len(qs), qs[0].shape[1]
    ks = [_kv_heads_for(k, h, n) for k in ks]
    vs = [_kv_heads_for(v, h, n) for v in vs]
    all_pos = torch.cat(pos)  # positions of the concatenated sequence
    qh, kh, vh = seq_to_head(qs), seq_to_head(ks), seq_to_head(vs)
    outs = [attn.attention(q, k, v, causal=causal, scale=scale, q_pos=all_pos, k_pos=all_pos)[0]
            for q, k, v in zip(qh, kh, vh)]  # (B, H/N, T, Dv) per head group
    return head_to_seq(outs, [int(p.numel()) for p in pos])


def reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True,
              scale: float | None = None) -> Tensor:
    return attn.reference(q, k, v, causal=causal, scale=scale)[0]
