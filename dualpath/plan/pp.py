"""Pipeline parallelism: stage layer split and prefill chunk split (docs/parallelism.md#pipeline-parallelism).

Stage split: with a speculative-decoding tail worth beta stages on the last rank,
the last stage gets about (L/p)*(1-beta) layers and the others share the rest
evenly (extra layers go to the middle stages, keeping the first stage, which also
embeds, light). Stage time is in layer units; the last stage adds beta*L/p.
Chunk split of a causal prefill of T tokens into m chunks with attention share a:
a chunk's time ~ (1-a)*len/(T/m) + a*(e^2 - s^2)/(T^2/m) (equal chunks give
(1-a) + a*(2k+1)/m); s_k = T*sqrt(k/m) equalises the attention part; the exact
equal-time split solves (1-a)*x + a*x^2 = k/m for x = s_k/T.
"""
from __future__ import annotations

import math
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


def _times(layers: list[int], tail: float) -> tuple[float, ...]:
    per_stage = sum(layers) / len(layers)
    return tuple(float(n) + (tail * per_stage if i == len(layers) - 1 else 0.0)
                 for i, n in enumerate(layers))


def _spread(total: int, stages: int) -> list[int]:
    """Even split; the remainder goes to the middle stages first."""
    base, extra = divmod(total, stages)
    order = sorted(range(stages), key=lambda i: (abs(i - (stages - 1) / 2), -i))
    out = [base] * stages
    for i in order[:extra]:
        out[i] += 1
    return out


def stage_split(layers: int, stages: int, tail: float = 0.0) -> StageSplit:
    if stages < 1 or layers < stages:
        raise ValueError(f"need 1 <= stages <= layers, got stages={stages} layers={layers}")
    if not 0 <= tail < 1:
        raise ValueError(f"tail beta must be in [0, 1), got {tail}")
    last = 0 if stages == 1 else max(1, round(layers / stages * (1 - tail)))
    split = [layers] if stages == 1 else _spread(layers - last, stages - 1) + [last]
    times = _times(split, tail)
    naive = _times(_spread(layers, stages), tail)
    mean = sum(times) / stages
    return StageSplit(tuple(split), times, max(times) / mean, max(naive) / mean)


def _chunk_times(bounds: list[int], seq: int, share: float) -> tuple[float, ...]:
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
    """x in [0, 1] with (1-a)*x + a*x^2 = y."""
    if a < 1e-12:
        return y
    return (-(1 - a) + math.sqrt((1 - a) ** 2 + 4 * a * y)) / (2 * a)
