"""Absorbed MLA decode straight from the paged latent cache: one new token per sequence, ragged contexts.

q (B, H, R) is already latent: all heads attend the same cached rows (out stays latent).
layer_kv (num_blocks, 2, bs, 1, W/2); masks: None or B bool (lens[i],) -> (B, H, values).
"""
from __future__ import annotations

import torch
from torch import Tensor


def _check(q: Tensor, layer_kv: Tensor, tables: Tensor, lens: list[int], values: int, masks) -> None:
    if q.dim() != 3 or layer_kv.dim() != 5 or layer_kv.shape[1] != 2 or layer_kv.shape[3] != 1 or tables.dim() != 2:
        raise ValueError(f"want q (B,H,R), layer_kv (N,2,bs,1,W/2), tables (B,max_blocks); got "
                         f"{tuple(q.shape)}, {tuple(layer_kv.shape)}, {tuple(tables.shape)}")
    width, bs = 2 * layer_kv.shape[-1], layer_kv.shape[2]
    if not 0 < values <= q.shape[-1] <= width:
        raise ValueError(f"need 0 < values ({values}) <= query width ({q.shape[-1]}) <= row width ({width})")
    if tables.shape[0] != q.shape[0] or len(lens) != q.shape[0]:
        raise ValueError(f"{q.shape[0]} queries but {tables.shape[0]} block tables and {len(lens)} lengths")
    for i, t in enumerate(lens):
        if not 1 <= t <= tables.shape[1] * bs:
            raise ValueError(f"sequence {i}: context length {t} outside [1, {tables.shape[1] * bs}]")
    if masks is not None and (len(masks) != len(lens) or any(m.shape != (t,) for m, t in zip(masks, lens))):
        raise ValueError("masks: one bool tensor of its context length per sequence")


def gather_rows(layer_kv: Tensor, blocks: Tensor) -> Tensor:
    """The latent rows of `blocks` (1-D long), joined from both planes: (len(blocks) * bs, W)."""
    slabs = layer_kv.index_select(0, blocks)[:, :, :, 0]  # (n, 2, bs, W/2)
    return torch.cat([slabs[:, 0], slabs[:, 1]], dim=-1).flatten(0, 1)


def paged_mla_decode(q: Tensor, layer_kv: Tensor, tables: Tensor, lens: list[int], *, values: int,
                     scale: float, masks: list[Tensor] | None = None) -> Tensor:
    _check(q, layer_kv, tables, lens, values, masks)
    bs, r = layer_kv.shape[2], q.shape[-1]
    n_blocks = [-(-t // bs) for t in lens]
    rows = gather_rows(layer_kv, torch.cat([tables[i, :n] for i, n in enumerate(n_blocks)]))  # (sum * bs, W)
    out = torch.empty(q.shape[0], q.shape[1], values, dtype=q.dtype, device=q.device)
    start = 0
    for i, t in enumerate(lens):
        mine = rows[start:start + t]
        scores = (q[i] @ mine[:, :r].T).float() * scale  # (H, T)
        if masks is not None:
            scores = scores.masked_fill(~masks[i], float("-inf"))
        torch.matmul(scores.softmax(-1).to(rows.dtype), mine[:, :values], out=out[i])
        start += n_blocks[i] * bs
    return out


def reference(q: Tensor, layer_kv: Tensor, tables: Tensor, lens: list[int], *, values: int, scale: float,
              masks: list[Tensor] | None = None) -> Tensor:
    _check(q, layer_kv, tables, lens, values, masks)
    bs, r = layer_kv.shape[2], q.shape[-1]
    outs = []
    for i, t in enumerate(lens):
        pos = torch.arange(t, device=tables.device)
        blocks, slots = tables[i][pos // bs], pos % bs
        row = torch.cat([layer_kv[blocks, 0, slots, 0], layer_kv[blocks, 1, slots, 0]], dim=-1)  # (T, W)
        scores = torch.einsum("hr,tr->ht", q[i].float(), row[:, :r].float()) * scale
        if masks is not None:
            scores = scores.masked_fill(~masks[i], float("-inf"))
        outs.append(torch.einsum("ht,tc->hc", scores.softmax(-1), row[:, :values].float()).to(q.dtype))
    return torch.stack(outs)
