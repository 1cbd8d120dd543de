"""What the benchmark replays: traces -> per-mode jobs of token-id turns.

Each (mode, job) draws its tokens from its own seed, so modes share no stored prefix; the
replayer fills in generated ids. Owns trace loading and token content, not HTTP.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, replace

import numpy as np

from dualpath.traces import Trajectory, expand_agents, generate, read_trajectories, with_tool_calls
from dualpath.traces.generator import PRESETS
from shared.messages.codes import LoadMode


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    mode: LoadMode
    turns: tuple[tuple[tuple[int, ...], int], ...]  # (append ids, gen tokens)
    arrival_s: float | None = None  # recorded arrival (Mooncake); None = scheduled by the driver
    tool_s: tuple[float, ...] = ()  # the tool call after turn i, seconds (the replayer waits it out)
    hinted: bool = False  # its turns carry agent_hints (session, the coming tool call, release at the end)

    def tool_after(self, i: int) -> float:
        return self.tool_s[i] if i < len(self.tool_s) else 0.0

    def hints(self, i: int) -> dict | None:
        """The `agent_hints` of turn `i`: the session, the tool call that follows it, `release` on the last."""
        if not self.hinted:
            return None
        if i == len(self.turns) - 1:
            return {"session_id": self.id, "release": True}
        tool = self.tool_after(i)
        return {"session_id": self.id, **({"expected_tool_duration_ms": round(tool * 1000)} if tool else {})}

    @property
    def prompt_lengths(self) -> list[int]:
        out, ctx = [], 0
        for a, g in self.turns:
            out.append(ctx + len(a))
            ctx += len(a) + g
        return out


@dataclass(frozen=True, slots=True)
class Workload:
    """The trace as loaded: either trajectories or Mooncake requests (never both)."""

    name: str
    trajectories: tuple[Trajectory, ...] = ()
    agents: tuple[tuple[int, int], ...] = ()  # (base index, synthetic first-round append) per agent
    mooncake: tuple = ()  # MooncakeRequest, ...
    scale: float = 1.0
    time_scale: float = 1.0
    tool_scale: float = 0.0  # tool calls: 0 = none; else the traced (or generated) durations times this


def token_range(model: str, vocab_size: int) -> tuple[int, int]:
    """Ids that are ordinary tokens: printable bytes for the tiny byte model, else a safe middle."""
    if vocab_size <= 512:
        return 32, 127
    return 100, vocab_size - 1000


def load(spec: str, agents: int | None, scale: float, seed: int = 0, time_scale: float = 1.0,
         tool_scale: float = 0.0) -> Workload:
    """`gen:32k` | `gen:48k` | `gen:64k` | `mooncake:PATH` | PATH (trajectory JSONL); with `tool_scale`
    > 0 every gap between turns is a tool call."""
    if spec.startswith("mooncake:"):
        from dualpath.traces.mooncake import read_mooncake

        reqs = read_mooncake(spec.split(":", 1)[1])
        return Workload(spec, mooncake=tuple(reqs[:agents] if agents else reqs), scale=scale, time_scale=time_scale)
    if spec.startswith("gen:"):
        name = spec.split(":", 1)[1].lower()
        if name not in PRESETS:
            raise ValueError(f"unknown generator preset {name!r} (choose {', '.join(PRESETS)})")
        n = agents or 8
        base = generate(name, n, seed=seed, scale=scale)
    else:
        base = [_scaled(t, scale) for t in read_trajectories(spec)]
        n = agents or len(base)
    if tool_scale > 0:
        base = with_tool_calls(base, seed)
    return Workload(spec, tuple(base), tuple(expand_agents(len(base), n, seed)), scale=scale, tool_scale=tool_scale)


def _scaled(t: Trajectory, scale: float) -> Trajectory:
    if scale == 1.0:
        return t
    turns = tuple((max(1 if i == 0 else 0, round(a * scale)), max(1, round(g * scale)))
                  for i, (a, g) in enumerate(t.turns))
    return replace(t, turns=turns)


def mode_salt(mode: LoadMode) -> int:
    """The seed salt of one mode's token content: CRC-32 of its name (stable across processes and orders)."""
    return zlib.crc32(LoadMode(mode).value.encode())


def jobs(w: Workload, mode: LoadMode, lo: int, hi: int, seed: int = 0, max_context: int = 0) -> list[TraceJob]:
    """The jobs one mode replays; turns past `max_context` (prompt + gen) are cut off."""
    salt = mode_salt(mode)
    if w.mooncake:
        return _mooncake_jobs(w, mode, lo, hi, seed * 1000 + salt, max_context)
    out = []
    for k, (base, pre) in enumerate(w.agents):
        rng = np.random.default_rng([seed, salt, k])
        traj = w.trajectories[base]
        turns = [(a, g) for a, g in traj.turns]
        # the synthetic first round of copies (gen = 1), plus a random first round for every
        # agent: a mode's copy never shares a prefix with another mode's (or agent's) copy
        turns = ([(pre, 1)] if pre else []) + turns
        built, ctx = [], 0
        for a, g in turns:
            if max_context and ctx + a + g > max_context:
                break
            built.append((tuple(rng.integers(lo, hi, a).tolist()), g))
            ctx += a + g
        gaps = ((0.0,) if pre else ()) + tuple(ms / 1000 * w.tool_scale for ms in traj.tool_ms)
        if built:
            out.append(TraceJob(f"{mode}/{traj.id}#{k}", mode, tuple(built), tool_s=gaps[:len(built) - 1]))
    return out


def with_hints(js: list[TraceJob], hints: str) -> list[TraceJob]:
    """`off`: no job hints; `on`: every job; `mixed`: every other one (the rest is unhinted traffic)."""
    if hints not in HINTS:
        raise ValueError(f"hints must be one of {', '.join(HINTS)}, got {hints!r}")
    return [replace(j, hinted=hints == "on" or (hints == "mixed" and k % 2 == 0)) for k, j in enumerate(js)]


HINTS = ("off", "on", "mixed")


def _mooncake_jobs(w: Workload, mode: LoadMode, lo: int, hi: int, salt: int, max_context: int) -> list[TraceJob]:
    from dualpath.traces.mooncake import output_length, prompt_tokens

    out = []
    t0 = w.mooncake[0].timestamp_ms
    for i, r in enumerate(w.mooncake):
        prompt = prompt_tokens(r, i, lo, hi, salt, w.scale)
        gen = output_length(r, w.scale)
        if max_context and len(prompt) + gen > max_context:
            prompt = prompt[: max(1, max_context - gen)]
        arrival = (r.timestamp_ms - t0) / 1000.0 * w.time_scale
        out.append(TraceJob(f"{mode}/mc{i}", mode, ((tuple(prompt), gen),), arrival_s=arrival))
    return out


def expected_hit_tokens(job: TraceJob, block: int) -> int:
    """Prompt tokens a perfect store serves from within the job: earlier turns' full blocks."""
    hit, ctx = 0, 0
    for a, g in job.turns:
        hit += (ctx // block) * block
        ctx += len(a) + g
    return hit
