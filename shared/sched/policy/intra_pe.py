"""Intra-PE batching under a compute quota: the attention-time model and the batch planner."""
from __future__ import annotations

from dataclasses import dataclass

import msgspec
from typing import Iterable


@dataclass(frozen=True, slots=True)
class AttentionModel:
    """Estimated attention time of a forward batch, in seconds.

    A request's `bsz` new tokens after `cached` ones cost, over i = 1..bsz: per_pair * sum(cached + i)
    + per_capped_pair * sum(min(cached + i, cap)) + per_token * bsz; a batch adds per_batch once."""

    per_pair: float = 0.0
    per_capped_pair: float = 0.0
    cap: int = 0
    per_token: float = 0.0
    per_batch: float = 0.0

    def request_time(self, cached: int, bsz: int) -> float:
        if bsz <= 0:
            return 0.0
        pairs = bsz * cached + bsz * (bsz + 1) // 2
        t = self.per_pair * pairs + self.per_token * bsz
        if self.per_capped_pair:
            t += self.per_capped_pair * _capped_pairs(cached, bsz, self.cap)
        return t

    def batch_time(self, pairs: Iterable[tuple[int, int]]) -> float:
        total = sum(self.request_time(c, b) for c, b in pairs)
        return total + self.per_batch if total > 0 else 0.0


def _capped_pairs(cached: int, bsz: int, cap: int) -> int:
    if cached >= cap:
        return bsz * cap
    below = min(bsz, cap - cached)  # tokens whose span is still under the cap
    return below * cached + below * (below + 1) // 2 + (bsz - below) * cap


class ReadyPrefill(msgspec.Struct, frozen=True):
    """A ready request on a PE: `cached` tokens have KV (hit + computed), `remaining` to go."""

    rid: int
    cached: int
    remaining: int
    whole: bool = False  # never chunked (its hits are held a few layers at a time): whole, or not in this batch


class PlannedChunk(msgspec.Struct, frozen=True):
    rid: int
    cached: int
    bsz: int


def plan_batch(
    work: Iterable[ReadyPrefill],
    model: AttentionModel,
    quota: float,
    align: int = 1,
    max_tokens: int = 0,
) -> list[PlannedChunk]:
    """Chunks for one forward batch, FIFO; empty only when `work` has nothing to compute.

    A request over the quota is cut to the largest multiple of `align` that fits, at least min(align,
    remaining) when first, and ends the batch; `max_tokens` (> 0) caps the batch's new tokens. A `whole`
    request is never cut: alone when first, else left out. `work` is read only until the batch is full."""
    out: list[PlannedChunk] = []
    used = model.per_batch
    budget_tokens = max_tokens if max_tokens > 0 else -1
    for w in work:
        if w.remaining <= 0:
            continue
        want = w.remaining if budget_tokens < 0 else min(w.remaining, budget_tokens)
        cost = model.request_time(w.cached, want)
        if used + cost <= quota and want == w.remaining:
            out.append(PlannedChunk(w.rid, w.cached, want))
            used += cost
            budget_tokens = budget_tokens - want if budget_tokens >= 0 else -1
            continue
        if w.whole:
            if not out:
                out.append(PlannedChunk(w.rid, w.cached, w.remaining))
            break
        bsz = _largest_fit(model, w.cached, want, quota - used, align)
        if bsz <= 0 and not out:
            bsz = min(align, want)  # want honours max_tokens too
        if bsz > 0:
            out.append(PlannedChunk(w.rid, w.cached, bsz))
        break
    return out


def _largest_fit(model: AttentionModel, cached: int, hi: int, room: float, align: int) -> int:
    """Largest bsz <= hi (a multiple of `align`, or hi itself) with time <= room; 0 if none."""
    if model.request_time(cached, hi) <= room:
        return hi
    lo_u, hi_u = 0, hi // align  # search in units of `align`; unit 0 always fits
    while lo_u < hi_u:
        mid = (lo_u + hi_u + 1) // 2
        if model.request_time(cached, mid * align) <= room:
            lo_u = mid
        else:
            hi_u = mid - 1
    return lo_u * align


def balanced_quota(times: Iterable[float], target: float) -> float:
    """The largest per-GPU attention budget c keeping a step unit's max/avg within `target`, given each
    working GPU's attention time under the plain quota (max(times) when nothing needs cutting)."""
    ts = sorted(t for t in times if t > 0.0)
    n = len(ts)
    if n == 0:
        return 0.0
    below = [0.0] * (n + 1)  # below[k]: the sum of the k smallest times
    for i, t in enumerate(ts):
        below[i + 1] = below[i] + t
    if ts[-1] * n <= target * below[n]:
        return ts[-1]
    for k in range(n - 1, 0, -1):
        # c in [ts[k-1], ts[k]]: k times stay, n - k are cut to c; c*n <= target*(below[k] + (n-k)*c)
        room = n - target * (n - k)
        if room <= 0.0:
            return ts[k]
        c = target * below[k] / room
        if c >= ts[k - 1]:
            return min(c, ts[k])
    return ts[0]
