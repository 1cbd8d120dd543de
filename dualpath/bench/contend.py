"""The probe of two engines computing at once on shared cores: a decode stream's step time while
a long prefill computes, over its step time alone.

The rate probes (`replay.probe_rates`) time each engine with the other idle. On a mesh whose
engines share one machine's cores they run side by side most of the time, each with its event
loop, its traffic manager and the bus beside it, and a step then takes longer than either
probe saw: more than the engines' share of the cores says when each engine's process keeps
more than one thread busy. `probe_pair` measures it: a short prompt decodes `n_gen` tokens,
once alone and once while a prompt long enough to keep the prefill engine computing for the
whole stream is prefilled; the ratio of the decode steps (best of `repeat` each, as the rate
probes) is `pair_slow`, what the simulator's host pool stretches both engines by while both
compute (dualpath/sim/hostcpu.py). Oracle mode: no KV moves, so only compute contends.

Owns: `probe_pair`. Does not own the rate probes (`replay.py`) nor the model of it (`hostcpu.py`).
"""
from __future__ import annotations

import asyncio
import json
import statistics
import time

import httpx
import numpy as np

from shared.messages.codes import LoadMode

N_GEN = 16
SPAN = 2.5  # the long prefill computes for about this many times the decode stream's length


async def _stream(client: httpx.AsyncClient, url: str, prompt: list[int], gen: int,
                  first: asyncio.Event | None = None) -> list[float]:
    """The arrival time of every token of one oracle-mode completion (`first` set at the first)."""
    body = {"prompt": prompt, "max_tokens": gen, "temperature": 0, "ignore_eos": True, "stream": True,
            "dualpath_mode": LoadMode.ORACLE}
    stamps: list[float] = []
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"contention probe: HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"contention probe: {chunk['error']}")
            if chunk.get("choices"):
                stamps.append(time.perf_counter())
                if first is not None:
                    first.set()
    return stamps


def long_prompt_tokens(rates: dict, max_context: int, n_gen: int = N_GEN) -> int:
    """A prompt whose prefill lasts about SPAN times a decode stream of `n_gen` tokens (within the context)."""
    want = SPAN * n_gen * rates["decode_step_s"] * rates["prefill_tok_s"]
    return int(max(128, min(want, max(128, max_context - 8))))


def probe_pair(url: str, lo: int, hi: int, rates: dict, max_context: int, n_gen: int = N_GEN,
               repeat: int = 3) -> dict:
    """{"pair_slow": decode step while a prefill computes / alone (>= 1), and the figures behind it}."""
    n_long = long_prompt_tokens(rates, max_context, n_gen)
    seed = int(time.time() * 1e6) % (1 << 31)

    async def once(client: httpx.AsyncClient, k: int, contended: bool) -> float:
        rng = np.random.default_rng([seed, k + 1, int(contended)])
        first = asyncio.Event()
        decode = asyncio.create_task(_stream(client, url, rng.integers(lo, hi, 16).tolist(), n_gen, first))
        await first.wait()  # its prefill is done: the decode engine steps from here
        if not contended:
            stamps = await decode
            return statistics.median(b - a for a, b in zip(stamps[1:], stamps[2:]))
        t0 = time.perf_counter()
        prefill = asyncio.create_task(_stream(client, url, rng.integers(lo, hi, n_long).tolist(), 1))
        stamps, (t1,) = await decode, await prefill
        gaps = [b - a for a, b in zip(stamps[1:], stamps[2:]) if a >= t0 and b <= t1]
        return statistics.median(gaps) if gaps else float("nan")

    async def go() -> dict:
        async with httpx.AsyncClient(timeout=300) as client:
            await once(client, -1, False)  # warm-up, discarded
            alone, pair = float("inf"), []
            for k in range(repeat):
                alone = min(alone, await once(client, k, False))
                pair.append(await once(client, k, True))
        pair = [p for p in pair if p == p]  # a prefill that ended before two decode steps: no figure
        if not pair:
            return {}
        best = min(pair)
        return {"pair_slow": max(1.0, best / alone), "pair_probe_alone_s": alone, "pair_probe_step_s": best,
                "pair_probe_long_tokens": n_long}

    return asyncio.run(go())
