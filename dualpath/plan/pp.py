"""Pipeline parallelism: stage layer split and prefill chunk split (docs/concepts/parallelism.md#pipeline-parallelism).

Two splits in time units: layers over stages (slowest stage, tail included, made fastest) and a
causal prefill's tokens over chunks (equal, sqrt and equal-time).
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StageSplit:
    layers: tuple[int, ...]  # per stage
    times: tuple[float, ...]  # layer units, last stage includes the tail
    max_over_mean: float
    naive_max_over_mean: float  # the even split with the same tail


@dataclass(frozen=True)
class ChunkSplit:
    name: str
    bounds: tuple[int, ...]  # m + 1 token offsets, 0 .. T
    sizes: tuple[int, ...]
    times: tuple[float, ...]  # relative to the mean chunk time (1.0)
    max_over_mean: float


def _times(layers: Sequence[int], tail: float) -> tuple[float, ...]:
    """Stage times in layer units: a layer costs 1; the last stage adds tail * L/p."""
    per_stage = sum(layers) / len(layers)
    return tuple(float(n) + (tail * per_stage if i == len(layers) - 1 else 0.0)
                 for i, n in enumerate(layers))


def _preference(stages: int) -> list[int]:
    """Rank of each stage for a tie: middle stages first, the first stage (it also embeds) last."""
    order = sorted(range(stages), key=lambda i: (abs(i - (stages - 1) / 2), -i))
    rank = [0] * stages
    for r, i in enumerate(order):
        rank[i] = r
    return rank


def _spread(total: int, stages: int) -> list[int]:
    """Even split; the remainder goes to the middle stages first."""
    base, extra = divmod(total, stages)
    rank = _preference(stages)
    return [base + (1 if rank[i] < extra else 0) for i in range(stages)]


def min_max_split(layers: int, extra: Sequence[float]) -> tuple[int, ...]:
    """Layer counts n_i >= 1 summing to `layers` that minimise max_i(n_i + extra_i).

    Greedy is exact: each added layer goes to the stage least loaded after it; ties follow `_preference`."""
    stages = len(extra)
    if stages < 1 or layers < stages:
        raise ValueError(f"need 1 <= stages <= layers, got stages={stages} layers={layers}")
    counts = [1] * stages
    rank = _preference(stages)
    heap = [(2 + extra[i], rank[i], i) for i in range(stages)]
    heapq.heapify(heap)
    for _ in range(layers - stages):
        _, r, i = heapq.heappop(heap)
        counts[i] += 1
        heapq.heappush(heap, (counts[i] + 1 + extra[i], r, i))
    return tuple(counts)


def stage_split(layers: int, stages: int, tail: float = 0.0) -> StageSplit:
    """The split of `layers` over `stages` whose slowest stage is fastest; the last stage also carries
    a speculative-decoding tail worth `tail` stages. Compared with the even split."""
    if stages < 1 or layers < stages:
        raise ValueError(f"need 1 <= stages <= layers, got stages={stages} layers={layers}")
    if not 0 <= tail < 1:
        raise ValueError(f"tail beta must be in [0, 1), got {tail}")
    split = min_max_split(layers, [0.0] * (stages - 1) + [tail * layers / stages])
    times = _times(split, tail)
    naive = _times(_spread(layers, stages), tail)
    mean = sum(times) / stages
    return StageSplit(split, times, max(times) / mean, max(naive) / mean)


def _chunk_times(bounds: list[int], seq: int, share: float) -> tuple[float, ...]:
    """Times of chunks [s, e) of a causal prefill of T tokens in m chunks, attention share a:
    (1-a)*len/(T/m) + a*(e^2 - s^2)/(T^2/m)."""
    m = len(bounds) - 1
    return tuple((1 - share) * (e - s) * m / seq + share * (e * e - s * s) * m / (seq * seq)
                 for s, e in zip(bounds, bounds[1:]))


def _chunk(name: str, fracs: list[float], seq: int, share: float) -> ChunkSplit:
    bounds = [round(f * seq) for f in fracs]
    times = _chunk_times(bounds, seq, share)
    sizes = tuple(e - s for s, e in zip(bounds, bounds[1:]))
    return ChunkSplit(name, tuple(bounds), sizes, times, max(times) * len(times) / sum(times))


def chunk_splits(seq: int, chunks: int, share: float) -> tuple[ChunkSplit, ...]:
    """Equal, sqrt (s_k = T*sqrt(k/m)) and exact equal-time splits of a prefill."""
    if chunks < 1 or seq < chunks:
        raise ValueError(f"need 1 <= chunks <= seq, got chunks={chunks} seq={seq}")
    if not 0 <= share <= 1:
        raise ValueError(f"attention share must be in [0, 1], got {share}")
    ks = range(chunks + 1)
    equal = [k / chunks for k in ks]
    sqrt = [math.sqrt(k / chunks) for k in ks]
    exact = [_solve(share, k / chunks) for k in ks]
    return (_chunk("equal", equal, seq, share), _chunk("sqrt", sqrt, seq, share),
            _chunk("equal-time", exact, seq, share))


def _solve(a: float, y: float) -> float:
    """x in [0, 1] with (1-a)*x + a*x^2 = y; the root as 2y / (b + sqrt(b^2 + 4ay)), exact as a -> 0."""
    if y <= 0:
        return 0.0
    return 2 * y / ((1 - a) + math.sqrt((1 - a) ** 2 + 4 * a * y))
