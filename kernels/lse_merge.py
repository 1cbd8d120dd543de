"""N-way merge of partial attention results by their log-sum-exp.

Each shard i attended to a disjoint part of the keys and returned (out_i, lse_i).
Softmax over the union of keys is recovered exactly:
    lse = logsumexp_i(lse_i);   out = sum_i exp(lse_i - lse) * out_i.
An empty shard (lse_i = -inf) gets weight 0; if every shard is empty the result is
out = 0, lse = -inf. Shapes: out_i (..., Dv), lse_i (...), any leading dims.
This is the combine step of split-KV flash-decoding, of DCP across cards and of each
ring-attention step.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def reference(outs: Sequence[Tensor], lses: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Merge N partials: outs[i] (..., Dv), lses[i] (...) -> (out (..., Dv), lse (...))."""
    if not outs or len(outs) != len(lses):
        raise ValueError(f"need matching non-empty lists, got {len(outs)} outs, {len(lses)} lses")
    acc = torch.promote_types(outs[0].dtype, torch.float32)
    o = torch.stack([x.to(acc) for x in outs])  # (N, ..., Dv)
    ls = torch.stack([x.to(acc) for x in lses])  # (N, ...)
    return merge_stacked(o, ls, out_dtype=outs[0].dtype)


def merge_stacked(o: Tensor, ls: Tensor, out_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """Same merge over dim 0 of stacked partials: o (N, ..., Dv), ls (N, ...)."""
    lse = torch.logsumexp(ls, dim=0)  # (...); -inf when all shards are empty
    safe = lse.masked_fill(torch.isinf(lse), 0.0)
    w = torch.exp(ls - safe)  # (N, ...); exp(-inf) = 0 for empty shards
    out = (w[..., None] * o.to(w.dtype)).sum(dim=0)  # (..., Dv)
    return out.to(out_dtype or o.dtype), lse


def merge(outs: Sequence[Tensor], lses: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Entry point; the merge is a few elementwise ops, so the reference is the kernel."""
    return reference(outs, lses)
