"""The co-run probe: how much slower each engine computes while the other computes beside it.

The rate probe times each engine alone. Here a decode batch runs and, once every stream decodes,
one fresh prompt is prefilled: its TTFT over the lone one, and the batch's steps while it computes
over the steps around it, are the slowdowns the simulator's host pool applies (dualpath/sim/hostcpu.py).
"""
from __future__ import annotations

import asyncio
import math
import time

import httpx
import numpy as np

from dualpath.bench.replay import one_turn
from shared.messages.codes import LoadMode


class _Stamps(list):
    """A stream's token arrival times; `decoding` is set once it has a token past its first."""

    def __init__(self) -> None:
        super().__init__()
        self.decoding = asyncio.Event()

    def append(self, t: float) -> None:
        super().append(t)
        if len(self) > 1:
            self.decoding.set()


def split_steps(stamps: list[list[float]], lo: float, hi: float) -> tuple[float, float] | None:
    """(mean step inside [lo, hi], mean step outside it) of streams decoding side by side, counted
    only while all decode; steps crossing lo or hi are left out. None without 2 inside and 3 outside."""
    start, end = max(s[0] for s in stamps), min(s[-1] for s in stamps)
    inside, outside = [], []
    for s in stamps:
        for a, b in zip(s, s[1:]):
            if a < start or b > end:
                continue
            if lo <= a and b <= hi:
                inside.append(b - a)
            elif b <= lo or a >= hi:
                outside.append(b - a)
    if len(inside) < 2 or len(outside) < 3:
        return None
    return sum(inside) / len(inside), sum(outside) / len(outside)


async def _once(client: httpx.AsyncClient, url: str, prompts: list[list[int]], gen: int,
                fresh: list[int]) -> tuple[float, tuple[float, float] | None]:
    """(TTFT of `fresh` beside the batch, the batch's (step beside it, step around it))."""
    stamps = [_Stamps() for _ in prompts]
    streams = [asyncio.ensure_future(one_turn(client, url, p, gen, LoadMode.ORACLE, 0.0, stamps_out=s))
               for p, s in zip(prompts, stamps)]
    whole = asyncio.ensure_future(asyncio.gather(*(s.decoding.wait() for s in stamps)))
    await asyncio.wait([whole, *streams], return_when=asyncio.FIRST_COMPLETED)
    res = None
    if whole.done():  # every stream decodes: the fresh prompt computes beside the batch
        sent = time.perf_counter()
        res, _ = await one_turn(client, url, fresh, 1, LoadMode.ORACLE, sent)
    whole.cancel()
    errors = [got.error for got, _ in await asyncio.gather(*streams) if got.error] + ([res.error] if res else [])
    if res is None or any(errors):
        raise RuntimeError(f"co-run probe failed: {next((e for e in errors if e), 'a stream ended before all decoded')}")
    return res.ttft, split_steps(stamps, sent, sent + res.ttft)


async def probe_corun(client: httpx.AsyncClient, url: str, lo: int, hi: int, shape: tuple[int, int, int],
                      alone: tuple[float, float], repeat: int = 2, max_gen: int = 512) -> dict:
    """{"corun_prefill_slow", "corun_decode_slow"} (>= 1, best of `repeat`): `shape` is (batch, its
    prompt tokens, the fresh prompt's tokens), `alone` (the fresh prompt's lone TTFT, the batch's step)."""
    batch, n_small, n_prompt = shape
    ttft_alone, step_alone = alone
    gen = min(max_gen, 32 + math.ceil(3 * ttft_alone / max(step_alone, 1e-4)))  # steps around it, then beside it
    best_p = best_d = math.inf
    for rep in range(repeat):
        rng = np.random.default_rng([int(time.time() * 1e6) % (1 << 31), rep])
        prompts = [rng.integers(lo, hi, n_small).tolist() for _ in range(batch)]
        ttft, steps = await _once(client, url, prompts, gen, rng.integers(lo, hi, n_prompt).tolist())
        best_p = min(best_p, ttft / ttft_alone)
        if steps is not None:
            best_d = min(best_d, steps[0] / steps[1])
    return {"corun_prefill_slow": max(1.0, best_p), "corun_decode_slow": max(1.0, best_d if best_d < math.inf else 1.0)}


def corun_rates(url: str, lo: int, hi: int, rates: dict, repeat: int = 2) -> dict:
    """`probe_corun` of the mesh at `url` on the shapes `rates` (replay.probe_rates) were probed with."""
    batch, n_prompt, n_small = rates["probe_batch"], rates["probe_prompt_tokens"], rates["probe_small_tokens"]
    alone = (rates["turn_overhead_s"] + n_prompt / rates["prefill_tok_s"],  # the lone TTFT of n_prompt tokens
             rates["decode_step_s"] + (batch - 1) * rates["decode_per_seq_s"])  # the batch's lone step

    async def go() -> dict:
        async with httpx.AsyncClient(timeout=600) as client:
            return await probe_corun(client, url, lo, hi, (batch, n_small, n_prompt), alone, repeat)
    return asyncio.run(go())
