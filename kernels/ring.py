"""Ring attention (pass-KV context parallelism) with online softmax.

Per rank: q (B, H, T_r, D), k (B, Hkv, T_r, D), v (B, Hkv, T_r, Dv), pos (T_r,).
"""
from __future__ import annotations

import torch
from torch import Tensor

from kernels import attention as attn
from kernels.lse_merge import merge_stacked


def _step(acc: tuple[Tensor, Tensor] | None, q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor,
          k_pos: Tensor, causal: bool, scale: float | None) -> tuple[Tensor, Tensor]:
    out, lse = attn.attention(q, k, v, causal=causal, scale=scale, q_pos=q_pos, k_pos=k_pos,
                              fp32_out=True)  # (B, H, T_r, Dv), (B, H, T_r)
    if acc is None:
        return out, lse
    return merge_stacked(torch.stack([acc[0], out]), torch.stack([acc[1], lse]))


def visible_pairs(q_pos: Tensor, k_pos: Tensor, causal: bool) -> int:
    """Query-key pairs a step actually uses (the work a fused kernel would do)."""
    if not causal:
        return int(q_pos.numel() * k_pos.numel())
    return int((k_pos[None, :] <= q_pos[:, None]).sum())


def ring_attention(qs: list[Tensor], ks: list[Tensor], vs: list[Tensor], pos: list[Tensor], *,
                   causal: bool = True, scale: float | None = None
                   ) -> tuple[list[Tensor], list[Tensor], list[int]]:
    """Simulated ring: (out per rank (q dtype), lse per rank, visible pairs per rank)."""
    n = len(qs)
    accs: list[tuple[Tensor, Tensor] | None] = [None] * n
    work = [0] * n
    for s in range(n):
        for r in range(n):
            src = (r - s) % n  # KV that has travelled s hops to reach rank r
            accs[r] = _step(accs[r], qs[r], ks[src], vs[src], pos[r], pos[src], causal, scale)
            work[r] += visible_pairs(pos[r], pos[src], causal)
    outs = [a[0].to(q.dtype) for a, q in zip(accs, qs)]  # type: ignore[index]
    return outs, [a[1] for a in accs], work  # type: ignore[index]


def ring_attention_dist(q: Tensor, k: Tensor, v: Tensor, pos: Tensor, *, causal: bool = True,
                        scale: float | None = None, group=None) -> tuple[Tensor, Tensor]:
    """This rank's part of a real ring. Every rank's k, v, pos must have equal shapes."""
    import torch.distributed as dist
    n, r = dist.get_world_size(group), dist.get_rank(group)
    nxt, prv = (r + 1) % n, (r - 1) % n
    if group is not None:
        nxt, prv = dist.get_global_rank(group, nxt), dist.get_global_rank(group, prv)
    cur = (k.contiguous(), v.contiguous(), pos.contiguous())
    acc = None
    for s in range(n):
        reqs, incoming = [], None
        if s < n - 1:  # post the pass of the current KV before computing on it
            incoming = tuple(torch.empty_like(t) for t in cur)
            ops = [dist.P2POp(dist.isend, t, nxt, group) for t in cur]
            ops += [dist.P2POp(dist.irecv, t, prv, group) for t in incoming]
            reqs = dist.batch_isend_irecv(ops)
        acc = _step(acc, q, cur[0], cur[1], pos, cur[2], causal, scale)
        for req in reqs:
            req.wait()
        if incoming is not None:
            cur = incoming
    return acc[0].to(q.dtype), acc[1]  # type: ignore[index]


def reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True,
              scale: float | None = None) -> tuple[Tensor, Tensor]:
    return attn.reference(q, k, v, causal=causal, scale=scale)
