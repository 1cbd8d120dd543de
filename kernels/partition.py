"""Causal sequence partitions for context parallelism, and their per-rank work."""
from __future__ import annotations

import torch
from torch import Tensor

SCHEMES = ("contiguous", "zigzag", "interleave")


def positions(seq: int, n: int, scheme: str, device=None) -> list[Tensor]:
    """Sorted int64 positions per rank (on `device`); together a partition of range(seq)."""
    if n < 1 or seq < 0:
        raise ValueError(f"need n >= 1 and seq >= 0, got n={n} seq={seq}")
    if scheme == "contiguous":
        cuts = [seq * r // n for r in range(n + 1)]
        return [torch.arange(cuts[r], cuts[r + 1], device=device) for r in range(n)]
    if scheme == "zigzag":
        cuts = [seq * j // (2 * n) for j in range(2 * n + 1)]
        return [torch.cat([torch.arange(cuts[r], cuts[r + 1], device=device),
                           torch.arange(cuts[2 * n - 1 - r], cuts[2 * n - r], device=device)]) for r in range(n)]
    if scheme == "interleave":
        return [torch.arange(seq, device=device)[r::n] for r in range(n)]
    raise ValueError(f"unknown scheme {scheme!r} (choose from {', '.join(SCHEMES)})")


def causal_work(seq: int, n: int, scheme: str) -> list[int]:
    return [int((p + 1).sum()) for p in positions(seq, n, scheme)]


def imbalance(work: list[int]) -> float:
    """max / mean; 1.0 is perfect balance."""
    return max(work) * len(work) / max(1, sum(work))


def split(x: Tensor, pos: list[Tensor], dim: int) -> list[Tensor]:
    return [x.index_select(dim, p.to(x.device)) for p in pos]


def unsplit(parts: list[Tensor], pos: list[Tensor], dim: int) -> Tensor:
    total = sum(int(p.numel()) for p in pos)
    shape = list(parts[0].shape)
    shape[dim] = total
    out = parts[0].new_empty(shape)
    for part, p in zip(parts, pos):
        out.index_copy_(dim, p.to(out.device), part)
    return out
