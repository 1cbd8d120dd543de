"""Absorbed MLA decode straight from the paged latent cache: one new token per sequence, ragged contexts.

Owns `paged_mla_decode(q, layer_kv, tables, lens, values=..., scale=...)`, the decode
engine's per-layer MLA attention (DeepSeek-V2/V3) in the absorbed form: the query has been
projected into the latent space (q_nope W_UK, then the roped q_pe), so every head attends
over the same cached rows, an MQA with one shared "head" of the row's width, and the
output is in the latent space too (the caller applies W_UV).

A cached row per token per layer is W values: the latent c_kv (its first `values`), the
shared rope key, then (V3.2) the indexer key, which attention does not read. The two-plane
cache keeps a row's first W/2 values in plane 0 and the rest in plane 1 at the token's slot
(shared/model/kv_geometry.py). The blocks of every sequence are gathered once, unpadded, by
one `index_select` over both planes (each block's slab is contiguous), and the halves are
joined; each sequence's scores are one (H, R) x (R, T) product over its rows.

Shapes:
  q        (B, H, R)                     R = kv_lora_rank + qk_rope_head_dim <= W
  layer_kv (num_blocks, 2, bs, 1, W/2)   one layer of the cache
  tables   (B, max_blocks) long          block tables (rows may be padded past `lens`)
  lens     list of B ints                context length of each sequence, new token included
  masks    None, or B bool tensors (lens[i],): the context tokens query i may attend
           (V3.2's top-k selection); None attends to all
  out      (B, H, values)                in q's dtype

`reference` is the plain-torch oracle: each sequence's rows read position by position,
explicit softmax.
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
    """Absorbed attention of each sequence's new token over its paged latent rows: (B, H, values)."""
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
    """Plain torch: rows looked up position by position, explicit softmax per sequence."""
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
