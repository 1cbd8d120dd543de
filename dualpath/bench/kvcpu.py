"""The probe of the KV path's CPU: mesh CPU seconds per byte its storage NICs move, oracle subtracted.

The rate probe (`replay.probe_rates`) runs in oracle mode and moves no KV, so it cannot see
what the KV path costs the host's cores: the storage gateways' reads and writes, the traffic
managers' copies, the engines' side of the pulls and pushes. On a mesh whose processes share
one machine that CPU comes out of the cores the engines compute on (dualpath/sim/hostcpu.py).
`probe_kv_cpu` replays the same small workload twice, each time on fresh tokens: a few
agents whose later turns hit their earlier ones, once in oracle mode (no KV moved) and once
in `dualpath-split` (stored blocks read on both nodes' paths, pulled, pushed and persisted);
it reads every mesh process's CPU seconds (/proc, `usage.snapshot`) and the storage bytes
read and written (the gateways' counters) around each, and, over a second before them, what
the idle mesh uses (heartbeats, polling) per second. The KV path's CPU per byte is the CPU
the KV run used beyond the oracle run's, less the idle mesh's for the KV run's longer wall
time, over the storage bytes it moved. The oracle run also gives what the mesh's processes
other than its engines (front door, scheduler, bus, gateways, traffic managers) keep busy
while agents run: their CPU seconds over its wall time, in cores (`background_cores`).
CPU seconds, unlike wall time, hardly move with the machine's other load.
Behind a slow storage NIC the workload is sized to its cap: its prompts shrink (not below
two blocks) so that what it reads and writes takes about `BUDGET_S` at the cap (a large
model's blocks behind a 0.05 Gbit/s NIC would otherwise take minutes per mode).
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
    """`agents` closed-loop agents at once: a fresh `first`-token prompt, then `append` more a turn;
    returns the prompt tokens the mesh computed (not served from stored KV)."""
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
    """CPU seconds per storage byte of the KV path: the KV run's CPU beyond the oracle run's, beyond
    the idle mesh's `idle_cpu` (CPU s per s) over its `extra_wall_s`, and beyond `recompute_cpu_s`,
    the prefill of prompt tokens it computed where the oracle's hits were free (0 when nothing moved)."""
    extra = kv_cpu_s - oracle_cpu_s - idle_cpu * max(0.0, extra_wall_s) - max(0.0, recompute_cpu_s)
    return max(0.0, extra) / storage_bytes if storage_bytes > 0 else 0.0


def first_tokens(max_context: int, turns: int, gen: int, agents: int, bytes_per_token: float = 0.0,
                 storage_bytes_per_s: float | None = None, budget_s: float = BUDGET_S) -> int:
    """The probe's first prompt: half the context at most (128-1,024 tokens), and, behind a
    capped storage NIC, short enough that the agents' turns move about `budget_s` of bytes
    at the cap (each turn reads or writes about its prompt once), two blocks of 64 at least."""
    first = min(1024, max(128, (max_context or 2048) // 2 - turns * (64 + gen)))
    if bytes_per_token > 0 and storage_bytes_per_s:
        fit = storage_bytes_per_s * budget_s / (agents * turns * bytes_per_token)
        first = min(first, max(128, int(fit) // 64 * 64))
    return first


def probe_kv_cpu(url: str, lo: int, hi: int, snap: Callable[[], Usage], max_context: int = 0,
                 agents: int = 4, turns: int = 3, gen: int = 8, bytes_per_token: float = 0.0,
                 storage_bytes_per_s: float | None = None, prefill_tok_s: float = 0.0) -> dict:
    """{"kv_cpu_s_per_byte": ..., and the figures behind it}; an empty dict when this host's
    CPU cannot be read (a remote mesh). With `prefill_tok_s` (the rate probe's, one engine
    thread: CPU seconds per token), the prompt tokens the KV run computed beyond the oracle's
    (turns that arrived before their earlier turn's blocks were written) are not charged to
    the KV path: their prefill is the engine's, and the simulator models those misses itself."""
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
    """`probe_kv_cpu` of the mesh at `url`, its processes' CPU read on this host (plus `extra_pids`: NATS)."""
    with httpx.Client() as client:
        return probe_kv_cpu(url, lo, hi, lambda: snapshot(client, url, extra_pids), max_context,
                            bytes_per_token=bytes_per_token, storage_bytes_per_s=storage_bytes_per_s,
                            prefill_tok_s=prefill_tok_s)
