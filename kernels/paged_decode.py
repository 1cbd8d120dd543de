"""Decode attention straight from a paged KV cache: one new token per sequence, ragged contexts.

q (B, H, D); layer_kv (num_blocks, 2, bs, Hkv, D); tables (B, max_blocks); lens: each
context's length, new token included -> (B, H, D). Blocks gathered once, unpadded.
"""
from __future__ import annotations

import torch
from torch import Tensor

from kernels import decode


def _check(q: Tensor, layer_kv: Tensor, tables: Tensor, lens: list[int]) -> None:
    if q.dim() != 3 or layer_kv.dim() != 5 or layer_kv.shape[1] != 2 or tables.dim() != 2:
        raise ValueError(f"want q (B,H,D), layer_kv (N,2,bs,Hkv,D), tables (B,max_blocks); got "
                         f"{tuple(q.shape)}, {tuple(layer_kv.shape)}, {tuple(tables.shape)}")
    b, h = q.shape[0], q.shape[1]
    hkv, bs = layer_kv.shape[3], layer_kv.shape[2]
    if tables.shape[0] != b or len(lens) != b:
        raise ValueError(f"{b} queries but {tables.shape[0]} block tables and {len(lens)} lengths")
    if h % hkv:
        raise ValueError(f"{h} query heads are not a multiple of {hkv} KV heads")
    for i, t in enumerate(lens):
        if not 1 <= t <= tables.shape[1] * bs:
            raise ValueError(f"sequence {i}: context length {t} outside [1, {tables.shape[1] * bs}]")


def gather_blocks(layer_kv: Tensor, kv: int, blocks: Tensor) -> Tensor:
    """K (kv=0) or V (kv=1) of `blocks` (1-D long), copied out: (len(blocks) * bs, Hkv, D)."""
    slabs = layer_kv[:, kv].index_select(0, blocks)  # (n, bs, Hkv, D); far faster than fancy indexing
    return slabs.reshape(-1, *slabs.shape[-2:])


def paged_decode(q: Tensor, layer_kv: Tensor, tables: Tensor, lens: list[int], *,
                 scale: float | None = None) -> Tensor:
    _check(q, layer_kv, tables, lens)
    b, h, d = q.shape
    bs, hkv = layer_kv.shape[2], layer_kv.shape[3]
    n_blocks = [-(-t // bs) for t in lens]
    flat = torch.cat([tables[i, :n] for i, n in enumerate(n_blocks)])
    k = gather_blocks(layer_kv, 0, flat)  # (sum of blocks * bs, Hkv, D)
    v = gather_blocks(layer_kv, 1, flat)
    qg = q.view(b, hkv, h // hkv, d) * (scale if scale is not None else d ** -0.5)
    out = torch.empty(b, hkv, h // hkv, layer_kv.shape[-1], dtype=q.dtype, device=q.device)
    start = 0
    for i, t in enumerate(lens):
        ki = k[start:start + t].permute(1, 2, 0)  # (Hkv, D, T): a view
        vi = v[start:start + t].transpose(0, 1)  # (Hkv, T, Dv)
        scores = torch.bmm(qg[i], ki).float()  # (Hkv, H/Hkv, T)
        torch.bmm(scores.softmax(-1).to(v.dtype), vi, out=out[i])
        start += n_blocks[i] * bs
    return out.view(b, h, -1)


def reference(q: Tensor, layer_kv: Tensor, tables: Tensor, lens: list[int], *,
              scale: float | None = None) -> Tensor:
    _check(q, layer_kv, tables, lens)
    bs = layer_kv.shape[2]
    outs = []
    for i, t in enumerate(lens):
        pos = torch.arange(t, device=tables.device)
        blocks = tables[i][pos // bs]
        k = layer_kv[blocks, 0, pos % bs]  # (T, Hkv, D)
        v = layer_kv[blocks, 1, pos % bs]
        outs.append(decode.reference(q[i][None], k, v, scale=scale)[0])
    return torch.stack(outs)
