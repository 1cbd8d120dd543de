"""N-way merge of partial attention results by their log-sum-exp."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def reference(outs: Sequence[Tensor], lses: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """outs[i] (..., Dv), lses[i] (...) -> (out (..., Dv), lse (...))."""
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
    return reference(outs, lses)
