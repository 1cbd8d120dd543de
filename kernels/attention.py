"""Attention that also returns the log-sum-exp (LSE) of each query's scores.

Owns the one attention primitive every split/merge scheme builds on: a shard of KV
yields (out, lse) and shards combine exactly by `kernels.lse_merge`. Supports GQA
(q has H heads, k/v have Hkv, H % Hkv == 0), causal masks by absolute positions
(so non-contiguous shards mask correctly) and empty shards (no visible key:
out = 0, lse = -inf). Math runs in fp32 (fp64 for fp64 inputs); out comes back in q's dtype.

Layout: q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv).
Causal default: queries are the last Tq of the Tk positions (bottom-right aligned).
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
    """Plain-torch attention: returns out (B, H, Tq, Dv) and lse (B, H, Tq) fp32.
    q_pos/k_pos: absolute positions, (T,) or per batch row (B, T); fp32_out keeps the
    output in fp32 (for callers that merge partials)."""
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
    """Entry point. No fused kernel ships yet, so every device runs the reference
    (plain torch works on CUDA tensors too); a Triton path would dispatch here."""
    return reference(q, k, v, causal=causal, scale=scale, q_pos=q_pos, k_pos=k_pos,
                     fp32_out=fp32_out)
