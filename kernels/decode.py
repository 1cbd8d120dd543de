"""Split-KV decode attention for one sequence (flash-decoding on CPU tensors)."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from kernels import attention as attn
from kernels.lse_merge import merge_stacked

DEFAULT_SPLIT = 2048


def _check(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"want q (Tq,H,D), k (T,Hkv,D), v (T,Hkv,Dv); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[0] != v.shape[0] or k.shape[0] < q.shape[0]:
        raise ValueError(f"need T >= Tq and k, v of equal length: Tq={q.shape[0]}, "
                         f"k T={k.shape[0]}, v T={v.shape[0]}")


def reference(q: Tensor, k: Tensor, v: Tensor, *, scale: float | None = None) -> Tensor:
    _check(q, k, v)
    out, _ = attn.reference(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                            v.transpose(0, 1)[None], causal=True, scale=scale)
    return out[0].transpose(0, 1)  # (Tq, H, Dv)


def split_kv(q: Tensor, k: Tensor, v: Tensor, *, split_size: int = DEFAULT_SPLIT,
             scale: float | None = None) -> tuple[Tensor, Tensor]:
    """(out (Tq, H, Dv), lse (Tq, H) fp32)."""
    _check(q, k, v)
    if split_size < 1:
        raise ValueError(f"split_size must be >= 1, got {split_size}")
    t, tq = k.shape[0], q.shape[0]
    qh = q.transpose(0, 1)[None]  # (1, H, Tq, D)
    q_pos = torch.arange(t - tq, t, device=q.device)  # (Tq,)
    all_pos = torch.arange(t, device=k.device)
    parts = []
    for start in range(0, t, split_size):  # each split is a strided view of the cache: no copy
        sl = slice(start, min(start + split_size, t))
        parts.append(attn.attention(qh, k[sl].transpose(0, 1)[None], v[sl].transpose(0, 1)[None],
                                    causal=True, scale=scale, q_pos=q_pos, k_pos=all_pos[sl],
                                    fp32_out=True))  # (1, H, Tq, Dv), (1, H, Tq)
    outs = torch.cat([o for o, _ in parts])  # (n, H, Tq, Dv)
    lses = torch.cat([lse for _, lse in parts])  # (n, H, Tq)
    out, lse = merge_stacked(outs, lses)  # (H, Tq, Dv), (H, Tq)
    return out.to(q.dtype).transpose(0, 1), lse.transpose(0, 1)


def decode_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float | None = None,
                     split_size: int = DEFAULT_SPLIT) -> Tensor:
    """q (Tq, H, D) or (H, D); k (T, Hkv, D); v (T, Hkv, Dv) -> (Tq, H, Dv) or (H, Dv)."""
    single = q.dim() == 2
    q3 = q[None] if single else q
    if k.shape[0] <= split_size:
        out = reference(q3, k, v, scale=scale)
    else:
        out, _ = split_kv(q3, k, v, split_size=split_size, scale=scale)
    return out[0] if single else out


def decode_attention_batch(q: Tensor, ks: list[Tensor], vs: list[Tensor], *,
                           scale: float | None = None,
                           split_size: int = DEFAULT_SPLIT) -> Tensor:
    if not (q.shape[0] == len(ks) == len(vs)):
        raise ValueError(f"batch {q.shape[0]} queries but {len(ks)} k and {len(vs)} v")
    return torch.stack([decode_attention(q[i], ks[i], vs[i], scale=scale, split_size=split_size)
                        for i in range(q.shape[0])])
