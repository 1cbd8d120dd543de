"""What the simulated agents do: trajectories, agent copies, arrivals, requests.

Hits are whole blocks of the same agent's earlier turns.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dualpath.sim.cluster import Req
from dualpath.traces import expand_agents, generate, read_trajectories, with_tool_calls
from dualpath.traces.generator import PRESETS

BLOCK = 64  # default tokens per KV block (SimConfig.block_tokens)


@dataclass
class SimWorkload:
    base: list[tuple[tuple[int, int], ...]]  # turns of each base trajectory
    agents: list[tuple[int, int]]  # (base index, prepended append or 0)
    starts: list[float]  # start time of each agent
    block: int = BLOCK  # tokens per KV block: hits are whole blocks
    tools: list[tuple[float, ...]] = field(default_factory=list)  # per base trajectory: tool call after turn i, s

    def tool_after(self, agent: int, k: int) -> float:
        """Seconds of the tool call between the agent's turn k and k+1 (0: none)."""
        b, pre = self.agents[agent]
        if not self.tools or (pre and k == 0):
            return 0.0
        i = k - 1 if pre else k
        t = self.tools[b]
        return t[i] if 0 <= i < len(t) else 0.0

    def __post_init__(self) -> None:
        self.turns_of = [len(self.base[b]) + (1 if pre else 0) for b, pre in self.agents]

    def n_turns(self, agent: int) -> int:
        return self.turns_of[agent]

    def turn(self, agent: int, k: int) -> tuple[int, int]:
        b, pre = self.agents[agent]
        if pre:
            return (pre, 1) if k == 0 else self.base[b][k - 1]
        return self.base[b][k]

    @property
    def total_requests(self) -> int:
        return sum(self.turns_of)

    def hit_ratio(self) -> float:
        """Token hit ratio of the base set (prompts weighted by length)."""
        hit = tot = 0
        for turns in self.base:
            ctx = 0
            for a, g in turns:
                h = min((ctx // self.block) * self.block, ctx + a - 1)
                hit += h
                tot += ctx + a
                ctx += a + g
        return hit / max(tot, 1)


def make_request(rid: int, agent: int, ctx: int, append: int, gen: int, t: float, block: int = BLOCK,
                 stored: int = -1) -> Req:
    """The request of a turn after `ctx` earlier tokens; `stored` >= 0: only that many are stored yet."""
    prompt = ctx + append
    hit = min((ctx // block) * block, prompt - 1)  # the last prompt token is always computed
    if 0 <= stored < hit:
        hit = stored
    return Req(rid, agent, prompt, hit, gen, t)


def load_workload(trace: str, agents: int, scale: float = 1.0, seed: int = 0,
                  aps: float = 0.0, block: int = BLOCK, tool_scale: float = 0.0,
                  append_scale: float = 1.0) -> SimWorkload:
    """Agents for a trace spec; online (aps > 0) Poisson starts; `tool_scale` > 0 adds tool calls between
    turns; `append_scale` scales every append but the first."""
    if trace.startswith("gen:"):
        parts = trace.split(":")
        name = parts[1].lower()
        if name not in PRESETS:
            raise ValueError(f"unknown generated trace {name!r}; known: {', '.join(PRESETS)}")
        n_base = int(parts[2]) if len(parts) > 2 else 500
        trajs = generate(name, n_base, seed=seed, scale=scale)
    else:
        trajs = read_trajectories(trace)
    tools = [tuple(ms / 1000 * tool_scale for ms in t.tool_ms) for t in with_tool_calls(trajs, seed)] \
        if tool_scale > 0 else []
    if not trace.startswith("gen:") and scale != 1.0:
        trajs = [_scaled(t.turns, scale) for t in trajs]  # type: ignore[misc]
    base = [t if isinstance(t, tuple) else t.turns for t in trajs]
    if append_scale != 1.0:
        base = [tuple((a if i == 0 else max(1, round(a * append_scale)), g) for i, (a, g) in enumerate(turns))
                for turns in base]
    specs = expand_agents(len(base), agents, seed)
    if aps > 0:
        gaps = np.random.default_rng([seed, 7]).exponential(1.0 / aps, size=len(specs))
        starts = np.cumsum(gaps).tolist()
    else:
        starts = [0.0] * len(specs)
    return SimWorkload(base, specs, starts, block, tools)


def from_turns(trajectories: list[tuple[tuple[int, int], ...]], block: int = BLOCK) -> SimWorkload:
    """One agent per trajectory of (append, gen) turns, all starting at t=0 (a bench replay)."""
    base = [tuple(t) for t in trajectories]
    return SimWorkload(base, [(i, 0) for i in range(len(base))], [0.0] * len(base), block)


def _scaled(turns: tuple[tuple[int, int], ...], scale: float) -> tuple[tuple[int, int], ...]:
    return tuple((max(1 if i == 0 else 0, round(a * scale)), max(1, round(g * scale)))
                 for i, (a, g) in enumerate(turns))
