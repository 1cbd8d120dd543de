"""One bench invocation's runs: each mode offline `repeat` times, or each mode's online capacity search.

Orders are rotated per repeat; a search level holds when its repeats' medians are within the SLO,
then bisects (metrics.ApsSearch). Owns run order and rows; numbers are metrics.py's and bound.py's.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import httpx

from dualpath.bench import hints as agent_hints
from dualpath.bench import replay
from dualpath.bench.bound import ChainTurn, MeshCapacity, lower_bound
from dualpath.bench.metrics import ApsSearch, Slo, spread, summarise
from dualpath.bench.scrape import Scraper
from dualpath.bench.usage import snapshot
from dualpath.bench.vllm_metrics import Spec
from shared.messages.codes import LoadMode


@dataclass
class RunPlan:
    url: str
    make_jobs: object  # (mode, n_agents) -> jobs of a fresh copy of the workload
    slo: Slo
    cap: MeshCapacity
    show: bool
    timeout: float
    block_size: int = 64
    extra_pids: tuple[int, ...] = ()  # this host's mesh processes not announced (nats-server)
    hint_runs: tuple[str, ...] = ("off",)  # agent-hint policies: one run each per mode (offline, fixed APS)
    tool_calls: bool = False  # the workload has tool calls between turns: each row gets the hint figures
    vllm: Spec = Spec()  # percentiles and goodput SLOs of the vLLM-named figures in each row


class Runner:
    def __init__(self, plan: RunPlan, scraper: Scraper, tms=None):
        self.p, self.scraper, self.tms = plan, scraper, tms  # tms: hints.TMScraper (prefetch figures)
        self.http = httpx.Client(timeout=10)
        self.rows: list[dict] = []
        self.bytes_per_token = 0.0

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc) -> None:
        self.http.close()

    def run(self, mode: LoadMode, aps: float | None, agents: int, seed: int, repeat: int, hints: str = "off") -> dict:
        p = self.p
        js = p.make_jobs(mode, agents, hints)
        before = snapshot(self.http, p.url, p.extra_pids)
        t0 = time.time()
        if aps is None:
            r = replay.offline(p.url, js, mode, p.show, p.timeout)
        else:
            r = replay.online(p.url, js, mode, aps, seed, p.show, p.timeout, stop_ttft_s=p.slo.ttft_s)
        time.sleep(self.scraper.period * 1.5)  # let the counters see the run's last reads and writes
        self.scraper.scrape_once()
        used = snapshot(self.http, p.url, p.extra_pids).minus(before)
        by_node, bpb = self.scraper.window(t0, time.time())
        if bpb:
            self.bytes_per_token = bpb / p.block_size
        row = summarise(r, p.slo, p.vllm)
        row.update(repeat=repeat, storage_read_bytes_per_node=by_node, usage=vars(used), stopped=r.stopped,
                   storage_series=self.scraper.series(t0, time.time()), jct_lower_bound_s=None)
        if r.kind == "offline":
            b = lower_bound(mode, used, _chains(r, self.bytes_per_token), p.cap)
            row.update(bound=b, jct_lower_bound_s=b["bound_s"],
                       jct_over_bound=row["jct_s"] / b["bound_s"] if b["bound_s"] else None)
        if p.tool_calls or hints != "off":
            row["hints"] = hints
            row.update(agent_hints.turn_figures(r))
            if self.tms is not None:
                pf = row["prefetch"] = self.tms.window(t0, time.time())
                pf["arrival_read_bytes"] = sum(by_node.values()) - pf["bulk_read_bytes"]
        self.rows.append(row)
        return row

    def offline(self, modes: list[LoadMode], agents: int, repeats: int) -> None:
        for k in range(repeats):
            for mode in _rotated(modes, k):
                for hints in self._policies(mode):
                    self.run(mode, None, agents, 0, k, hints)

    def fixed(self, modes: list[LoadMode], aps: float, agents: int, repeats: int, seed: int) -> None:
        for k in range(repeats):
            for mode in _rotated(modes, k):
                for hints in self._policies(mode):
                    self.run(mode, aps, agents, seed + k, k, hints)

    def _policies(self, mode: LoadMode) -> tuple[str, ...]:
        return ("off",) if mode == LoadMode.ORACLE else self.p.hint_runs  # oracle moves no KV: nothing to hint

    def search(self, modes: list[LoadMode], start: float, agents_for, repeats: int, seed: int, precision: float,
               max_levels: int) -> dict:
        searches = {m: ApsSearch(start, precision=precision, max_levels=max_levels) for m in modes}
        levels: dict = {m: [] for m in modes}
        step = 0
        while any(s.next() is not None for s in searches.values()):
            live = [m for m in _rotated(modes, step) if searches[m].next() is not None]
            wanted = {m: searches[m].next() for m in live}
            rows = {m: [] for m in live}
            for k in range(repeats):
                for m in _rotated(live, k):
                    rows[m].append(self.run(m, wanted[m], agents_for(wanted[m]), seed + 97 * step + k, k))
            for m in live:
                level = _level(wanted[m], rows[m], self.p.slo)
                levels[m].append(level)
                searches[m].record(wanted[m], level["holds"])
            step += 1
        return {m: {"capacity_aps": s.best, "bracket": [s.good, None if math.isinf(s.bad) else s.bad],
                    "levels": levels[m]} for m, s in searches.items()}


def _level(aps: float, rows: list[dict], slo: Slo) -> dict:
    """One mode at one load level over its repeats: the verdict and the spread that backs it."""
    ttft = spread(r.get("ttft_steady_mean_s") for r in rows)
    tpot = spread(r.get("tpot_steady_mean_s") for r in rows)
    att = spread(r["slo_attainment"] for r in rows)
    failed = sorted({r["slo_failed"] for r in rows if r.get("slo_failed")})
    holds = not any(r["errors"] or r.get("stopped") for r in rows) and ttft["median"] is not None \
        and ttft["median"] <= slo.ttft_s and (tpot["median"] is None or tpot["median"] <= slo.tpot_s)
    why = "" if holds else ("; ".join(failed) or ("ttft" if ttft["median"] and ttft["median"] > slo.ttft_s
                                                   else "tpot"))
    return {"aps": aps, "holds": holds, "failed": why, "turns": sum(r["turns"] for r in rows),
            "ttft_mean_s": ttft, "tpot_mean_s": tpot, "attainment": att}


def _rotated(modes: list, k: int) -> list:
    k %= max(1, len(modes))
    return modes[k:] + modes[:k]


def _chains(r, bytes_per_token: float) -> list[list[ChainTurn]]:
    by_job: dict[str, list] = {}
    for t in sorted(r.turns, key=lambda t: (t.job, t.turn)):
        if not t.error:
            by_job.setdefault(t.job, []).append(ChainTurn(t.prompt_tokens - t.cached_tokens, t.gen_tokens,
                                                          t.cached_tokens * bytes_per_token, t.ttft,
                                                          t.end - t.start - t.ttft))
    return list(by_job.values())


def agents_for_turns(min_turns: int, agents: int, turns_per_agent: int) -> int:
    """Agents a level replays: `agents`, or more when fewer would not give `min_turns` turns."""
    return max(agents, -(-min_turns // max(1, turns_per_agent)))


def agents_for_level(aps: float, min_seconds: float, min_turns: int, agents: int, turns_per_agent: int) -> int:
    """Agents a level at `aps` replays: enough for `min_turns` turns and `min_seconds` of arrivals,
    at least `agents`."""
    return max(agents_for_turns(min_turns, agents, turns_per_agent), math.ceil(aps * min_seconds - 1e-9))

