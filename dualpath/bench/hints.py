"""The bench's agent-hint figures: TTFT after a tool call, hinted vs unhinted vs oracle.

Only turns that follow a tool call count (only they can be prefetched). `TMScraper` samples the
traffic managers' and gateways' prefetch counters during the run.
"""
from __future__ import annotations

import re
import statistics
import time

import httpx

from dualpath.bench.metrics import percentile
from dualpath.bench.scrape import Poller
from shared.messages.codes import LoadMode

_LINE = re.compile(r"^(dualpath_\w+)(\{[^}]*\})? ([0-9.eE+-]+)$", re.M)
SERIES = {  # our name -> (metric, label filter)
    "staged_bytes": ("dualpath_traffic_manager_prefetch_staged_bytes", ""),
    "used_bytes": ("dualpath_traffic_manager_bytes_total", 'kind="prefetch_used"'),
    "stage_bytes": ("dualpath_traffic_manager_bytes_total", 'kind="prefetch_stage"'),
    "bulk_read_bytes": ("dualpath_storage_gateway_bulk_read_bytes_total", ""),
}


def turn_figures(run) -> dict:
    """TTFT percentiles of the turns that followed a tool call, split by whether their agent hinted."""
    out: dict = {}
    after = [t for t in run.turns if t.after_tool_s > 0 and not t.error]
    for name, rows in (("hinted", [t for t in after if t.hinted]), ("unhinted", [t for t in after if not t.hinted])):
        out[f"{name}_turns"] = len(rows)
        for q in (50, 99):
            out[f"{name}_ttft_p{q}_s"] = percentile([t.ttft for t in rows], q)
    out["tool_s_mean"] = sum(t.after_tool_s for t in after) / len(after) if after else None
    return out


def ratios(runs: list[dict]) -> dict:
    """Hinted / oracle and mixed-run unhinted / hints-off TTFT, p50 and p99: per repeat, then the median."""
    each = ratios_each(runs)
    return {k: statistics.median(v) for k, v in each.items()}


def ratios_each(runs: list[dict]) -> dict[str, list[float]]:
    """The ratios of every repeat, in repeat order (a key missing from a repeat is left out there)."""
    out: dict[str, list[float]] = {}
    for k in sorted({r.get("repeat", 0) for r in runs}):
        for key, v in _ratios([r for r in runs if r.get("repeat", 0) == k]).items():
            out.setdefault(key, []).append(v)
    return out


def _ratios(runs: list[dict]) -> dict:
    by = {(r["mode"], r.get("hints", "off")): r for r in runs}
    oracle = next((r for (m, _), r in by.items() if m == LoadMode.ORACLE), None)
    out = {}
    for (mode, hints), r in by.items():
        if mode == LoadMode.ORACLE:
            continue
        off = by.get((mode, "off"))
        for q in (50, 99):
            if hints in ("on", "mixed") and oracle and oracle.get(f"unhinted_ttft_p{q}_s"):
                out[f"{mode}/{hints}: hinted / oracle TTFT p{q}"] = r[f"hinted_ttft_p{q}_s"] / oracle[
                    f"unhinted_ttft_p{q}_s"]
            if hints in ("on", "mixed") and off and oracle and oracle.get(f"unhinted_ttft_p{q}_s"):
                out[f"{mode}/off: unhinted / oracle TTFT p{q}"] = off[f"unhinted_ttft_p{q}_s"] / oracle[
                    f"unhinted_ttft_p{q}_s"]
            if hints == "mixed" and off and off.get(f"unhinted_ttft_p{q}_s"):
                out[f"{mode}/mixed: unhinted / hints-off unhinted TTFT p{q}"] = r[f"unhinted_ttft_p{q}_s"] / off[
                    f"unhinted_ttft_p{q}_s"]
    return {k: v for k, v in out.items() if v == v}


def markdown(doc: dict) -> list[str]:
    runs = [r for r in doc["runs"] if "hinted_turns" in r]
    if not runs:
        return []
    lines = ["## Agent hints (turns after a tool call)", "",
             "| mode | hints | repeat | tool call mean s | hinted turns | TTFT p50 / p99 s | unhinted turns | TTFT p50 / p99 s "
             "| JCT s | prefetched / read-at-arrival MB | bulk MB read | peak staged MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        p = r.get("prefetch") or {}
        lines.append(
            f"| {r['mode']} | {r.get('hints', 'off')} | {r.get('repeat', 0)} | {_f(r.get('tool_s_mean'))} "
            f"| {r['hinted_turns']} "
            f"| {_f(r['hinted_ttft_p50_s'])} / {_f(r['hinted_ttft_p99_s'])} | {r['unhinted_turns']} "
            f"| {_f(r['unhinted_ttft_p50_s'])} / {_f(r['unhinted_ttft_p99_s'])} | {_f(r.get('jct_s'))} "
            f"| {_mb(p.get('used_bytes'))} / {_mb(p.get('arrival_read_bytes'))} | {_mb(p.get('bulk_read_bytes'))} "
            f"| {_mb(p.get('peak_staged_bytes'))} |")
    rat, each = doc.get("hint_ratios") or {}, doc.get("hint_ratios_each") or {}
    lines += [""] + [f"- {k}: {v:.2f}x" + (f" (median of {len(each[k])}: {', '.join(f'{x:.2f}' for x in each[k])})"
                                            if len(each.get(k, ())) > 1 else "") for k, v in rat.items()] + [""]
    return lines


def _f(v) -> str:
    return "n/a" if v is None or v != v else f"{v:.3f}"


def _mb(v) -> str:
    return "n/a" if v is None else f"{v / 1e6:.2f}"


class TMScraper(Poller):
    """Polls every traffic-manager's and gateway's /metrics (SERIES) in a thread."""

    def __init__(self, url: str, period_s: float = 0.5):
        super().__init__(url, period_s, "bench-hints-scrape")
        self.samples: list[tuple[float, dict[str, float]]] = []  # (unix time, summed series)
        self.urls: list[str] = []

    def discover(self) -> None:
        mesh = self._http.get(self.url + "/v1/mesh", timeout=10).json()
        self.urls = sorted({p["metrics_url"] for kind in ("traffic_managers", "gateways")
                            for p in mesh.get(kind, []) if p.get("metrics_url")})

    def scrape_once(self) -> None:
        got = {k: 0.0 for k in SERIES}
        for u in self.urls:
            try:
                text = self._http.get(u).text
            except httpx.HTTPError:
                continue
            for name, labels, value in _LINE.findall(text):
                for key, (metric, want) in SERIES.items():
                    if name == metric and want in (labels or ""):
                        got[key] += float(value)
        self.samples.append((time.time(), got))

    def window(self, t0: float, t1: float) -> dict:
        """Counters' growth in [t0, t1] and the peak of the staged-bytes gauge."""
        rows = [s for t, s in self.samples if t0 <= t <= t1] or [s for _, s in self.samples[-1:]]
        before = [s for t, s in self.samples if t <= t0]
        first = before[-1] if before else rows[0]
        last = rows[-1]
        out = {k: last[k] - first[k] for k in ("used_bytes", "stage_bytes", "bulk_read_bytes")}
        out["peak_staged_bytes"] = max(s["staged_bytes"] for s in rows)
        return out
