"""Intra-PE batching under a compute quota (docs/concepts/design.md#batching-inside-a-prefill-engine).

Owns the attention-time model over (cached, bsz) pairs and the batch planner: take a
PE's ready requests in FIFO order while the estimated attention time of the batch stays
within the quota; the first request that would exceed it gets the largest chunk that
still fits (binary search), and the batch ends there (chunked prefill).

Example: quota 0.3 s; requests a(cached 0, remaining 4096), b(cached 30000, remaining
500). If a costs 0.1 s and a+b would cost 0.45 s, b gets the largest bsz' <= 500 with
t(a, b[:bsz']) <= 0.3 s, rounded down to `align` tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import msgspec
from typing import Iterable


@dataclass(frozen=True, slots=True)
class AttentionModel:
    """Estimated attention time of a forward batch, in seconds.

    For one request with `cached` tokens of KV and `bsz` new tokens, token i of the new
    ones attends to cached + i tokens. Terms (all seconds):
      per_pair * sum_i (cached + i)                 full attention (or a sparse indexer)
      per_capped_pair * sum_i min(cached + i, cap)  attention over at most `cap` tokens
                                                    (sliding window / top-k sparse)
      per_token * bsz                               per-token projections in attention
    plus `per_batch` once per batch. Coefficients come from FLOPs fitted to profiled time.
    """

    per_pair: float = 0.0
    per_capped_pair: float = 0.0
    cap: int = 0
    per_token: float = 0.0
    per_batch: float = 0.0

    def request_time(self, cached: int, bsz: int) -> float:
        """Attention time of one request's `bsz` new tokens after `cached` tokens."""
        if bsz <= 0:
            return 0.0
        pairs = bsz * cached + bsz * (bsz + 1) // 2
        t = self.per_pair * pairs + self.per_token * bsz
        if self.per_capped_pair:
            t += self.per_capped_pair * _capped_pairs(cached, bsz, self.cap)
        return t

    def batch_time(self, pairs: Iterable[tuple[int, int]]) -> float:
        """Attention time of a batch given its (cached, bsz) pairs."""
        total = sum(self.request_time(c, b) for c, b in pairs)
        return total + self.per_batch if total > 0 else 0.0


def _capped_pairs(cached: int, bsz: int, cap: int) -> int:
    """sum over i = 1..bsz of min(cached + i, cap)."""
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
    """Compute `bsz` tokens of request `rid` after its `cached` tokens in this batch."""

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
    """Chunks for one forward batch; empty only when `work` has nothing to compute.

    `work` may be a lazy iterable: it is consumed only until the quota is full.

    FIFO; a request that would push the estimate over `quota` is cut to the largest
    multiple of `align` that fits (binary search on the monotone time), and ends the
    batch. The first chunk of a batch always has at least min(align, remaining) tokens
    so that progress is guaranteed. `max_tokens` (> 0) caps the batch's new tokens, the
    first chunk included. A `whole` request is never cut: it ends the batch before it when
    it does not fit, and goes alone (over the quota) when it is first.
    """
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
    """The largest per-GPU attention budget c that keeps a step unit's GPUs within `target`.

    `times` are the attention times the GPUs of one step unit (attention DP, one EP stage
    after it) would run under the plain quota, one per GPU with work. Capping each at c
    gives max/avg = c / mean(min(t, c)); that grows with c, so the largest c at or under
    `target` is found segment by segment between the sorted times. Returns max(times) when
    the batches are already within `target` (nothing is cut), 0.0 for no times.

    Example: times [0.30, 0.10, 0.10, 0.10], target 1.05: uncapped 0.30 / 0.15 = 2.0; capped
    at c = 0.1068 the mean is 0.1017 and c / mean = 1.05, so the first GPU's batch is cut to
    0.1068 s (chunked prefill) and the others wait 7 ms for it instead of 200 ms.
    """
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
