"""Drivers that replay jobs against a mesh over HTTP (asyncio + httpx, streaming SSE).

One turn is one streamed completion; a job is a closed loop of turns. Offline, every job starts
at t=0; online, at its arrival, and a run stops once its TTFT is past the limit.
"""
from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from dataclasses import dataclass, field

import httpx
import numpy as np

from dualpath.bench import vllm_metrics
from dualpath.bench.workload import TraceJob
from shared.messages.codes import LoadMode


@dataclass(slots=True)
class TurnResult:
    job: str
    turn: int
    prompt_tokens: int
    gen_tokens: int
    start: float  # seconds since the run's t0
    ttft: float
    ttst: float  # time to the second token (nan with gen == 1)
    end: float
    cached_tokens: int
    error: str = ""
    hinted: bool = False  # sent agent_hints
    after_tool_s: float = 0.0  # the tool call this turn waited for (0: none; the first turn never has one)
    stamps: list[float] = field(default_factory=list)  # arrival of each content chunk (s since the run's t0)
    tiers: dict[str, int] = field(default_factory=dict)  # usage's dualpath_tiers: prompt tokens by tier ({}: none)

    @property
    def e2el(self) -> float:
        """Start to the last content chunk (to the stream's end when none was stamped)."""
        return (self.stamps[-1] if self.stamps else self.end) - self.start

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.stamps, self.stamps[1:])]

    @property
    def tpot(self) -> float:
        """Mean time per output token after the first: (e2el - ttft) / (tokens - 1); nan with one."""
        return vllm_metrics.tpot(self)


@dataclass
class RunResult:
    mode: LoadMode
    kind: str  # offline | online
    aps: float | None
    turns: list[TurnResult] = field(default_factory=list)
    job_ends: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    t0_unix: float = 0.0
    stopped: str = ""  # why an online run was stopped early ("": it ran to the end)


class _StopRun(Exception):
    """Raised inside a run's task group to end every agent at once."""


STOP_WINDOW = 8  # turns whose mean TTFT decides an early stop


class ProgressBar:
    """A one-line text bar on stderr, redrawn at most 5 times a second."""

    def __init__(self, total: int, label: str, stream=sys.stderr, enabled: bool = True):
        self.total, self.label, self.stream, self.enabled = max(total, 1), label, stream, enabled
        self.done, self._last = 0, 0.0

    def step(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.2 or self.done >= self.total):
            self._last = now
            filled = int(30 * self.done / self.total)
            self.stream.write(f"\r{self.label:<24} [{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total}")
            if self.done >= self.total:
                self.stream.write("\n")
            self.stream.flush()


async def one_turn(client: httpx.AsyncClient, url: str, prompt: list[int], gen: int, mode: LoadMode,
                   t0: float, hints: dict | None = None, stamps_out: list[float] | None = None
                   ) -> tuple[TurnResult, list[int]]:
    """Stream one completion; returns its timings and generated ids (arrival times into `stamps_out`)."""
    body = {"prompt": prompt, "max_tokens": gen, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True, "dualpath_mode": mode}
    if hints:
        body["agent_hints"] = hints
    start = time.perf_counter()
    stamps: list[float] = []
    ids: list[int] = []
    cached, err, tiers = 0, "", {}
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            err = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
        else:
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    err = str(chunk["error"].get("message", chunk["error"]))
                elif chunk.get("choices"):
                    stamps.append(time.perf_counter())
                    if stamps_out is not None:
                        stamps_out.append(stamps[-1])
                if "usage" in chunk:
                    details = chunk["usage"]["prompt_tokens_details"]
                    cached, tiers = details["cached_tokens"], details.get("dualpath_tiers", {})
                    ids = list(chunk.get("token_ids", []))
    end = time.perf_counter()
    ttft = stamps[0] - start if stamps else float("nan")
    ttst = stamps[1] - start if len(stamps) > 1 else float("nan")
    if not err and len(ids) != gen:
        err = f"got {len(ids)} token ids, wanted {gen}"
    res = TurnResult("", 0, len(prompt), gen, start - t0, ttft, ttst, end - t0, cached, err,
                     stamps=[s - t0 for s in stamps], tiers=tiers)
    return res, ids


async def run_job(client: httpx.AsyncClient, url: str, job: TraceJob, t0: float, out: RunResult,
                  progress: ProgressBar, stop_ttft_s: float = 0.0) -> None:
    context: list[int] = []
    for i, (append, gen) in enumerate(job.turns):
        tool = job.tool_after(i - 1) if i else 0.0
        if tool:
            await asyncio.sleep(tool)  # the agent's tool call runs; the mesh may prefetch meanwhile
        prompt = context + list(append)
        res, ids = await one_turn(client, url, prompt, gen, job.mode, t0, job.hints(i))
        res.job, res.turn, res.hinted, res.after_tool_s = job.id, i, job.hinted, tool
        out.turns.append(res)
        progress.step()
        if stop_ttft_s and len(out.turns) >= STOP_WINDOW:
            last = [t.ttft for t in out.turns[-STOP_WINDOW:] if t.ttft == t.ttft]
            if last and sum(last) / len(last) > stop_ttft_s:
                out.stopped = f"mean TTFT of the last {STOP_WINDOW} turns {sum(last) / len(last):.2f} s"
                raise _StopRun()
        if res.error:
            progress.step(len(job.turns) - i - 1)
            break
        context = prompt + ids
    out.job_ends[job.id] = time.perf_counter() - t0


def poisson_arrivals(n: int, aps: float, seed: int) -> list[float]:
    """Arrival times (s) of n agents at `aps` agents per second (exponential gaps, first at 0)."""
    gaps = np.random.default_rng([seed, 7]).exponential(1.0 / aps, n)
    return np.concatenate(([0.0], np.cumsum(gaps[1:]))).tolist() if n else []


async def _drive(url: str, jobs: list[TraceJob], arrivals: list[float], mode: LoadMode, kind: str, aps: float | None,
                 show: bool, timeout: float, stop_ttft_s: float = 0.0) -> RunResult:
    out = RunResult(mode, kind, aps, t0_unix=time.time())
    progress = ProgressBar(sum(len(j.turns) for j in jobs), f"{kind} {mode}" + (f" @{aps:g}" if aps else ""),
                        enabled=show)
    # idle connections go before the server's 5 s keep-alive does: an agent back from a tool call
    # must not send its turn on a connection the server is closing (httpx.ReadError)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=1.0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
        t0 = time.perf_counter()

        async def start_at(job: TraceJob, at: float) -> None:
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
            await run_job(client, url, job, t0, out, progress, stop_ttft_s)

        try:
            async with asyncio.TaskGroup() as tg:
                for job, at in zip(jobs, arrivals):
                    tg.create_task(start_at(job, at))
        except* _StopRun:  # every other agent was cancelled (their streams closed: the mesh cancels them)
            if show:
                print(f"\n{kind} {mode} @{aps:g}: stopped, {out.stopped}", file=sys.stderr)
        out.wall_s = time.perf_counter() - t0
    return out


def offline(url: str, jobs: list[TraceJob], mode: LoadMode, show: bool = True, timeout: float = 600) -> RunResult:
    return asyncio.run(_drive(url, jobs, [0.0] * len(jobs), mode, "offline", None, show, timeout))


def online(url: str, jobs: list[TraceJob], mode: LoadMode, aps: float, seed: int = 0, show: bool = True,
           timeout: float = 600, stop_ttft_s: float = 0.0) -> RunResult:
    recorded = all(j.arrival_s is not None for j in jobs)
    arrivals = [j.arrival_s for j in jobs] if recorded else poisson_arrivals(len(jobs), aps, seed)
    return asyncio.run(_drive(url, jobs, arrivals, mode, "online", aps, show, timeout, stop_ttft_s))


def together_step(stamps: list[list[float]], prompt: int) -> tuple[float, float] | None:
    """(seconds per step, mean context) of streams decoding side by side, counted only while all decode;
    None when that window holds fewer than 3 tokens of some stream."""
    lo, hi = max(s[0] for s in stamps), min(s[-1] for s in stamps)
    steps, ctx = [], []
    for s in stamps:
        idx = [i for i, t in enumerate(s) if lo <= t <= hi]
        if len(idx) < 3:
            return None
        steps.append((s[idx[-1]] - s[idx[0]]) / (idx[-1] - idx[0]))
        ctx.append(prompt + (idx[0] + idx[-1]) / 2)
    return sum(steps) / len(steps), sum(ctx) / len(ctx)


def probe_rates(url: str, lo: int, hi: int, n_prompt: int = 256, n_gen: int = 16, batch: int = 4,
                repeat: int = 2, long_ctx: int = 0, max_gen: int = 512) -> dict:
    """One engine's rates, best of `repeat` fresh prompts: prefill tokens/s and fixed seconds per turn,
    decode seconds per step and per further sequence, and with `long_ctx` per context token."""
    n_small = max(8, n_prompt // 4)

    async def ttft_tpot(client, n: int, k: int, gen: int = n_gen, reps: int = repeat) -> tuple[float, float, float]:
        """(best TTFT, best step, the context of the best step's window)."""
        best_f, best_d, best_ctx = float("inf"), float("inf"), n + gen / 2
        for rep in range(reps):
            seed = int(time.time() * 1e6) % (1 << 31)
            prompts = [np.random.default_rng([seed, rep, i]).integers(lo, hi, n).tolist() for i in range(k)]
            stamps: list[list[float]] = [[] for _ in range(k)]
            got = await asyncio.gather(*(one_turn(client, url, p, gen, LoadMode.ORACLE, time.perf_counter(),
                                                  stamps_out=st) for p, st in zip(prompts, stamps)))
            for res, _ in got:
                if res.error:
                    raise RuntimeError(f"probe request failed: {res.error}")
            best_f = min(best_f, min(res.ttft for res, _ in got))
            both = together_step(stamps, n) if k > 1 else None
            step, ctx = both or (sum(res.tpot for res, _ in got) / k, n + gen / 2)
            if step < best_d:
                best_d, best_ctx = step, ctx
        return best_f, best_d, best_ctx

    async def go() -> dict:
        async with httpx.AsyncClient(timeout=600) as client:
            await ttft_tpot(client, n_prompt, batch)  # warm-up, discarded: a fresh mesh's first turns run slow
            small, step1, _ = await ttft_tpot(client, n_small, 1)
            big, _, _ = await ttft_tpot(client, n_prompt, 1)
            _, step_k, ctx_k = await ttft_tpot(client, n_small, batch)
            per_token = max((big - small) / (n_prompt - n_small), 1e-9)
            per_ctx = 0.0
            if long_ctx > n_small:
                apart = (batch - 1) * long_ctx * per_token  # at most: the others' prefills one after another
                gen = min(max_gen, long_ctx, max(4 * n_gen, n_gen + math.ceil(apart / max(step_k, 1e-4))))
                _, step_long, ctx_long = await ttft_tpot(client, long_ctx, batch, gen, min(repeat, 2))
                per_ctx = max(0.0, (step_long - step_k) / (batch * max(1.0, ctx_long - ctx_k)))
        return {"prefill_tok_s": 1.0 / per_token, "turn_overhead_s": max(0.0, small - n_small * per_token),
                "decode_step_s": step1, "decode_per_seq_s": max(0.0, (step_k - step1) / (batch - 1)),
                "decode_per_ctx_s": per_ctx,
                "decode_probe_ctx": n_small + n_gen // 2, "probe_prompt_tokens": n_prompt, "probe_batch": batch,
                "probe_small_tokens": n_small}
    return asyncio.run(go())


def probe(url: str, lo: int, hi: int, n_prompt: int = 256, n_gen: int = 16, repeat: int = 2) -> tuple[float, float]:
    """(prefill tokens/s, decode seconds/token) of one engine: best of `repeat` fresh prompts."""
    async def go() -> tuple[float, float]:
        best_p, best_d = 0.0, float("inf")
        async with httpx.AsyncClient(timeout=120) as client:
            for k in range(repeat):
                prompt = np.random.default_rng([int(time.time() * 1e6) % (1 << 31), k]).integers(lo, hi, n_prompt)
                res, _ = await one_turn(client, url, prompt.tolist(), n_gen, LoadMode.ORACLE, time.perf_counter())
                if res.error:
                    raise RuntimeError(f"probe request failed: {res.error}")
                best_p = max(best_p, n_prompt / res.ttft)
                best_d = min(best_d, res.tpot)
        return best_p, best_d
    return asyncio.run(go())
