"""Attention that also returns the log-sum-exp (LSE) of each query's scores.

GQA, causal by absolute positions, empty shards give out = 0, lse = -inf. Layout:
q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv); causal queries are the last Tq.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


def _positions(q: Tensor, k: Tensor, q_pos: Tensor | None,
               k_pos: Tensor | None) -> tuple[Tensor, Tensor]:
    tq, tk = q.shape[-2], k.shape[-2]
    if k_pos is None:
        k_pos = torch.arange(tk, device=q.device)
    if q_pos is None:
        q_pos = torch.arange(tk - tq, tk, device=q.device)
    return q_pos, k_pos


def _mask(qp: Tensor, kp: Tensor) -> Tensor:
    """True where key is in the future. qp (Tq,) or (B, Tq); kp (Tk,) or (B, Tk)."""
    m = kp.unsqueeze(-2) > qp.unsqueeze(-1)  # (Tq, Tk) or (B, Tq, Tk)
    return m if m.dim() == 2 else m[:, None]  # broadcast over heads


def reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
              scale: float | None = None, q_pos: Tensor | None = None,
              k_pos: Tensor | None = None, fp32_out: bool = False) -> tuple[Tensor, Tensor]:
    """Returns out (B, H, Tq, Dv) and lse (B, H, Tq) fp32; q_pos/k_pos: (T,) or (B, T)."""
    b, h, tq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    acc = torch.promote_types(q.dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
    hkv, tk = k.shape[1], k.shape[2]
    if h % hkv:
        raise ValueError(f"query heads {h} not a multiple of kv heads {hkv}")
    g = h // hkv  # query heads per KV head; head i uses KV head i // g
    qg = q.to(acc).reshape(b, hkv, g * tq, d)  # (B, Hkv, G*Tq, D): no KV copies for GQA
    s = torch.matmul(qg, k.to(acc).transpose(-1, -2)) * scale  # (B, Hkv, G*Tq, Tk)
    s = s.view(b, h, tq, tk)  # (B, H, Tq, Tk)
    if causal:
        qp, kp = _positions(q, k, q_pos, k_pos)
        s = s.masked_fill(_mask(qp, kp), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (B, H, Tq); -inf where no key is visible
    p = torch.exp(s - lse.masked_fill(torch.isinf(lse), 0.0)[..., None])
    out = torch.matmul(p.view(b, hkv, g * tq, tk), v.to(acc))  # (B, Hkv, G*Tq, Dv)
    out = out.view(b, h, tq, v.shape[-1])  # (B, H, Tq, Dv); rows with lse=-inf are 0
    return (out if fp32_out else out.to(q.dtype)), lse


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
              scale: float | None = None, q_pos: Tensor | None = None,
              k_pos: Tensor | None = None, fp32_out: bool = False) -> tuple[Tensor, Tensor]:
    return reference(q, k, v, causal=causal, scale=scale, q_pos=q_pos, k_pos=k_pos,
                     fp32_out=fp32_out)
