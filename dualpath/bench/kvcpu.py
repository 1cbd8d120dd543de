"""The probe of the KV path's CPU: mesh CPU seconds per byte its storage NICs move, oracle subtracted.

The same small workload runs in oracle mode (no KV moved) and in `dualpath-split`; the KV path's
CPU is the difference, less the idle mesh's, over the storage bytes moved. The oracle run also
gives the non-engine processes' busy cores (`background_cores`).
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable

import httpx
import numpy as np

from dualpath.bench.replay import one_turn
from dualpath.bench.usage import Usage, snapshot
from shared.messages.codes import LoadMode

BUDGET_S = 20.0  # storage seconds at the NIC cap the workload's bytes should take, per mode
SETTLE_POLLS = 20  # snapshots 0.25 s apart until the storage counters stand still (persistence is asynchronous)


def _storage_bytes(u: Usage) -> float:
    return sum(u.read_bytes.values()) + sum(u.written_bytes.values())


def _settled(snap: Callable[[], Usage]) -> Usage:
    last = snap()
    for _ in range(SETTLE_POLLS):
        time.sleep(0.25)
        now = snap()
        if _storage_bytes(now) == _storage_bytes(last):
            return now
        last = now
    return last


def _workload(url: str, lo: int, hi: int, mode: LoadMode, agents: int, turns: int, first: int,
              append: int, gen: int, seed: int) -> int:
    """`agents` closed-loop agents at once; returns the prompt tokens the mesh computed (not from KV)."""
    computed = [0]

    async def agent(client: httpx.AsyncClient, k: int) -> None:
        rng = np.random.default_rng([seed, k])
        context: list[int] = []
        for i in range(turns):
            prompt = context + rng.integers(lo, hi, first if i == 0 else append).tolist()
            res, ids = await one_turn(client, url, prompt, gen, mode, time.perf_counter())
            if res.error:
                raise RuntimeError(f"KV CPU probe request failed: {res.error}")
            computed[0] += res.prompt_tokens - res.cached_tokens
            context = prompt + ids

    async def go() -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            await asyncio.gather(*(agent(client, k) for k in range(agents)))
    asyncio.run(go())
    return computed[0]


def per_byte(kv_cpu_s: float, oracle_cpu_s: float, storage_bytes: float, idle_cpu: float = 0.0,
             extra_wall_s: float = 0.0, recompute_cpu_s: float = 0.0) -> float:
    """CPU s per storage byte: the KV run's beyond the oracle's, the idle mesh's and `recompute_cpu_s`."""
    extra = kv_cpu_s - oracle_cpu_s - idle_cpu * max(0.0, extra_wall_s) - max(0.0, recompute_cpu_s)
    return max(0.0, extra) / storage_bytes if storage_bytes > 0 else 0.0


def first_tokens(max_context: int, turns: int, gen: int, agents: int, bytes_per_token: float = 0.0,
                 storage_bytes_per_s: float | None = None, budget_s: float = BUDGET_S) -> int:
    """The probe's first prompt: 128-1,024 tokens, within half the context and ~`budget_s` at a capped NIC."""
    first = min(1024, max(128, (max_context or 2048) // 2 - turns * (64 + gen)))
    if bytes_per_token > 0 and storage_bytes_per_s:
        fit = storage_bytes_per_s * budget_s / (agents * turns * bytes_per_token)
        first = min(first, max(128, int(fit) // 64 * 64))
    return first


def probe_kv_cpu(url: str, lo: int, hi: int, snap: Callable[[], Usage], max_context: int = 0,
                 agents: int = 4, turns: int = 3, gen: int = 8, bytes_per_token: float = 0.0,
                 storage_bytes_per_s: float | None = None, prefill_tok_s: float = 0.0) -> dict:
    """{"kv_cpu_s_per_byte": ..., and the figures behind it}; {} when this host's CPU cannot be read.
    With `prefill_tok_s`, prompt tokens recomputed beyond the oracle's are not charged to the KV path."""
    first = first_tokens(max_context, turns, gen, agents, bytes_per_token, storage_bytes_per_s)
    seed = int(time.time() * 1e6) % (1 << 31)
    t0, idle0 = time.perf_counter(), snap()
    time.sleep(1.0)
    idle = snap().minus(idle0)
    if idle.cpu_s is None:
        return {}
    idle_cpu = idle.cpu_s / (time.perf_counter() - t0)
    used: dict[str, Usage] = {}
    wall: dict[str, float] = {}
    busy: dict[str, float] = {}  # the agents' time alone (no settling)
    computed: dict[str, int] = {}  # prompt tokens computed
    for i, mode in enumerate((LoadMode.ORACLE, LoadMode.DUALPATH_SPLIT)):
        before = _settled(snap)
        t0 = time.perf_counter()
        computed[mode] = _workload(url, lo, hi, mode, agents, turns, first, 64, gen, seed + i)
        busy[mode] = time.perf_counter() - t0
        used[mode] = _settled(snap).minus(before)
        wall[mode] = time.perf_counter() - t0
    kv, oracle = used[LoadMode.DUALPATH_SPLIT], used[LoadMode.ORACLE]
    if kv.cpu_s is None or oracle.cpu_s is None:
        return {}
    moved = _storage_bytes(kv)
    extra_wall = wall[LoadMode.DUALPATH_SPLIT] - wall[LoadMode.ORACLE]
    recomputed = max(0, computed[LoadMode.DUALPATH_SPLIT] - computed[LoadMode.ORACLE])
    recompute_s = recomputed / prefill_tok_s if prefill_tok_s > 0 else 0.0
    # the oracle run's CPU outside the engines while its agents ran (the idle mesh's while it settled left out)
    others = oracle.cpu_s - sum(oracle.engine_cpu_s.values()) \
        - idle_cpu * (wall[LoadMode.ORACLE] - busy[LoadMode.ORACLE])
    return {"kv_cpu_s_per_byte": per_byte(kv.cpu_s, oracle.cpu_s, moved, idle_cpu, extra_wall, recompute_s),
            "background_cores": max(0.0, others) / busy[LoadMode.ORACLE],
            "kv_probe_storage_bytes": moved, "kv_probe_cpu_s": kv.cpu_s, "kv_probe_oracle_cpu_s": oracle.cpu_s,
            "kv_probe_idle_cpu": idle_cpu, "kv_probe_extra_wall_s": extra_wall,
            "kv_probe_oracle_engine_cpu_s": sum(oracle.engine_cpu_s.values()), "kv_probe_oracle_s": busy[LoadMode.ORACLE],
            "kv_probe_first_tokens": first, "kv_probe_recomputed_tokens": recomputed,
            "kv_probe_recompute_cpu_s": recompute_s}


def probe_mesh(url: str, lo: int, hi: int, max_context: int = 0, extra_pids: tuple[int, ...] = (),
               bytes_per_token: float = 0.0, storage_bytes_per_s: float | None = None,
               prefill_tok_s: float = 0.0) -> dict:
    """`probe_kv_cpu` of the mesh at `url`, CPU read on this host (plus `extra_pids`: NATS)."""
    with httpx.Client() as client:
        return probe_kv_cpu(url, lo, hi, lambda: snapshot(client, url, extra_pids), max_context,
                            bytes_per_token=bytes_per_token, storage_bytes_per_s=storage_bytes_per_s,
                            prefill_tok_s=prefill_tok_s)
