"""Seeded generator of agent trajectories calibrated to the published trace table.

Every draw is seeded by (seed, index), so a trajectory does not depend on how many are made;
`scale` multiplies every length; tool calls come from a stream of their own.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dualpath.traces.format import Trajectory

BLOCK = 64
TOOL_MEDIAN_S = 2.0  # agent traces' typical tool call (file reads, greps: < 1 s; test runs: tens of s)
TOOL_SIGMA = 1.0
TOOL_CLIP_S = (0.05, 120.0)


@dataclass(frozen=True, slots=True)
class TracePreset:
    """Generator parameters for one trace set (fitted to the published means)."""

    name: str
    max_len: int
    turns: float  # mean turns
    turns_sigma: float  # lognormal sigma of the turn count
    fill: float  # mean final length / max_len
    first_share: float  # mean share of the first turn
    gen_share: float  # mean share of generated tokens in a turn


@dataclass(frozen=True, slots=True)
class TraceStats:
    """The columns of the published trace table, plus the block-granular hit ratio."""

    n: int
    turns: float
    append: float  # mean over trajectories of the per-turn mean append
    gen: float
    total: float
    context: float  # mean prompt length over all turns of all trajectories
    max_len: int
    hit_ratio: float


PRESETS = {
    "32k": TracePreset("32k", 32768, 61.5, 0.67, 0.874, 0.20, 0.203),
    "48k": TracePreset("48k", 49152, 108.5, 0.68, 0.867, 0.17, 0.268),
    "64k": TracePreset("64k", 65536, 161, 0.72, 0.854, 0.16, 0.300),
}
PUBLISHED = {  # turns, append, gen, total, context (docs/concepts/design.md#agent-traces)
    "32k": (60, 608, 148, 28639, 17183),
    "48k": (106, 474, 172, 42607, 25120),
    "64k": (157, 429, 176, 55958, 32721),
}


def generate(preset: str | TracePreset, n: int = 500, seed: int = 0, scale: float = 1.0,
             tools: bool = False) -> list[Trajectory]:
    """`n` trajectories of a preset ("32k", "48k", "64k"), lengths times `scale`; `tools` adds tool calls."""
    p = PRESETS[preset] if isinstance(preset, str) else preset
    if not 0 < scale <= 1 or n < 1:
        raise ValueError(f"need n >= 1 and 0 < scale <= 1, got n={n}, scale={scale}")
    out = [_one(p, seed, i, scale) for i in range(n)]
    return with_tool_calls(out, seed) if tools else out


def with_tool_calls(trajs: list[Trajectory], seed: int = 0, median_s: float = TOOL_MEDIAN_S,
                    sigma: float = TOOL_SIGMA, keep: bool = True) -> list[Trajectory]:
    """Each trajectory with a tool call in every gap between turns; `keep`: recorded durations stay."""
    if median_s <= 0 or sigma < 0:
        raise ValueError(f"need median_s > 0 and sigma >= 0, got {median_s}, {sigma}")
    out = []
    for i, t in enumerate(trajs):
        if keep and t.tool_ms:
            out.append(t)
            continue
        rng = np.random.default_rng([seed, i, 0x7001])
        s = np.clip(rng.lognormal(np.log(median_s), sigma, len(t.turns) - 1), *TOOL_CLIP_S)
        out.append(replace(t, tool_ms=tuple(int(round(x * 1000)) for x in s)))
    return out


def _one(p: TracePreset, seed: int, index: int, scale: float) -> Trajectory:
    rng = np.random.default_rng([seed, index])
    mu = np.log(p.turns) - p.turns_sigma**2 / 2
    n = int(np.clip(round(rng.lognormal(mu, p.turns_sigma)), 2, 4 * p.turns))
    k = 6.0
    total = p.max_len * rng.beta(p.fill * k, (1 - p.fill) * k)
    total = max(total, 16.0 * n)
    w1 = float(np.clip(rng.normal(p.first_share, 0.05), 0.02, 0.6))
    rest = rng.gamma(1.0, size=n - 1)
    weights = np.concatenate(([w1], (1 - w1) * rest / rest.sum()))
    sizes = np.maximum(np.floor(total * weights * scale), 2).astype(np.int64)
    q = rng.beta(p.gen_share * 8, (1 - p.gen_share) * 8, size=n)
    gen = np.clip(np.rint(sizes * q), 1, sizes - 1).astype(np.int64)
    app = sizes - gen
    turns = tuple(zip(app.tolist(), gen.tolist()))
    return Trajectory(f"{p.name}-{seed}-{index}", turns, {"max_len": int(p.max_len * scale)})


def expand_agents(n_base: int, n_agents: int, seed: int = 0) -> list[tuple[int, int]]:
    """Agents as (base trajectory index, first-round append); copies past the base set get random tokens."""
    if n_base < 1 or n_agents < 0:
        raise ValueError("need n_base >= 1 and n_agents >= 0")
    rng = np.random.default_rng([seed, 1 << 20])
    out = [(i, 0) for i in range(min(n_base, n_agents))]
    extra = n_agents - len(out)
    if extra > 0:
        bases = rng.integers(0, n_base, size=extra).tolist()
        pre = rng.integers(16, 128, size=extra).tolist()
        out.extend(zip(bases, pre))
    return out


def trace_stats(trajs: list[Trajectory], block: int = BLOCK) -> TraceStats:
    """Published-table statistics of a set; hits are whole stored blocks of earlier turns."""
    turns = np.array([len(t.turns) for t in trajs], dtype=float)
    app = [np.mean([a for a, _ in t.turns]) for t in trajs]
    gen = [np.mean([g for _, g in t.turns]) for t in trajs]
    prompts = np.concatenate([np.array(t.prompts(), dtype=float) for t in trajs])
    hit = miss = 0
    for t in trajs:
        ctx = 0
        for a, g in t.turns:
            h = (ctx // block) * block
            hit += h
            miss += ctx + a - h
            ctx += a + g
    return TraceStats(
        n=len(trajs), turns=float(turns.mean()), append=float(np.mean(app)), gen=float(np.mean(gen)),
        total=float(np.mean([t.total_tokens for t in trajs])), context=float(prompts.mean()),
        max_len=max(t.total_tokens for t in trajs), hit_ratio=hit / max(hit + miss, 1))
