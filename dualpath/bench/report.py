"""The benchmark's outputs: a markdown report, the JSON document and PNG plots.

JSON: {"trace": ..., "config": {...}, "runs": [one object per (mode, load level)],
"search": {mode: best APS} (online search only)}. Plots (matplotlib, Agg backend):
jct_by_mode.png (offline), ttft_tpot_vs_aps.png (online), storage_read_bytes.png (bytes
read per node over time, one panel per mode). Owns formatting only; no measurement.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from shared.messages.codes import LoadMode


def _f(v, unit: str = "", digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.{digits}f}{unit}" if isinstance(v, float) else f"{v}{unit}"


def _mb(b: float) -> str:
    return f"{b / 1e6:.2f}"


def ratios(doc: dict) -> dict:
    """The DualPath headline ratios of an offline run (modes present in it only):
    speedup over basic (basic JCT / dualpath JCT), distance from oracle (dualpath JCT /
    oracle JCT), and the spread of storage bytes read across nodes (max/avg, dualpath)."""
    runs = [r for r in doc["runs"] if r.get("hints", "off") == "off"]  # hinted runs: dualpath/bench/hints.py
    jct = {r["mode"]: r["jct_s"] for r in runs if r["kind"] == "offline" and r.get("jct_s")}
    out = {}
    dual, basic, oracle = LoadMode.DUALPATH, LoadMode.BASIC, LoadMode.ORACLE
    if dual in jct and basic in jct:
        out["dualpath_speedup_over_basic"] = jct[basic] / jct[dual]
    if dual in jct and oracle in jct:
        out["dualpath_over_oracle"] = jct[dual] / jct[oracle]
    dp = next((r for r in runs if r["kind"] == "offline" and r["mode"] == dual), None)
    reads = list((dp or {}).get("storage_read_bytes_per_node", {}).values())
    if reads and sum(reads) > 0:
        out["dualpath_read_bytes_max_over_avg"] = max(reads) / (sum(reads) / len(reads))
    return out


def markdown(doc: dict) -> str:
    cfg = doc.get("config", {})
    lines = [f"# dualpath bench: {doc.get('trace', '?')}", ""]
    lines.append(", ".join(f"{k}={v}" for k, v in cfg.items() if v not in (None, "")))
    lines.append("")
    offline = [r for r in doc["runs"] if r["kind"] == "offline"]
    online = [r for r in doc["runs"] if r["kind"] == "online"]
    if offline:
        lines += ["## Offline (all agents start together; closed loop per agent)", "",
                  "| mode | JCT s | simulator's prediction s | measured/predicted | lower bound s | measured/bound "
                  "| bound set by | hit ratio | turns | errors | storage MB read per node |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in offline:
            b = r.get("bound") or {}
            ratio = r["jct_s"] / r["jct_lower_bound_s"] if r.get("jct_lower_bound_s") else None
            nodes = " ".join(f"{n}:{_mb(v)}" for n, v in sorted(r["storage_read_bytes_per_node"].items()))
            lines.append(f"| {_name(r)} | {_f(r['jct_s'])} | {_f(r.get('predicted_jct_s'))} "
                         f"| {_f(r.get('measured_over_predicted'), 'x', 2)} | {_f(r.get('jct_lower_bound_s'))} "
                         f"| {_f(ratio, 'x', 2)} | {b.get('limit') or 'n/a'} | {_f(r['hit_ratio'])} | {r['turns']} "
                         f"| {r['errors']} | {nodes} |")
        lines += ["", "Lower bound = max(storage: hit KV bytes / read bandwidth of the nodes allowed to read, "
                  "compute: miss tokens / summed prefill rate, serial: the longest agent's chain). Prediction: "
                  "`dualpath sim` replaying the same turns on a cluster of this mesh's shape, fitted to the "
                  "probed rates below (dualpath/sim/calibrate.py).", ""]
        pr = (doc.get("prediction") or {}).get("rates")
        if pr:
            lines += [f"- probed: prefill {pr['prefill_tok_s']:.0f} tok/s + {pr['turn_overhead_s'] * 1e3:.0f} ms a "
                      f"turn; decode step {pr['decode_step_s'] * 1e3:.1f} ms + {pr['decode_per_seq_s'] * 1e3:.1f} ms "
                      f"per further sequence; KV {pr['kv_bytes_per_token']:.0f} B/token; storage NIC "
                      f"{(pr['snic_bytes_s'] or 0) / 1e6:.1f} MB/s per node; data plane "
                      f"{pr['data_plane_bytes_s'] / 1e9:.2f} GB/s; alpha {pr['alpha_tokens']}, beta "
                      f"{pr['beta_tokens']} tokens", ""]
        for r in offline:
            b = r.get("bound") or {}
            lines.append(f"- {_name(r)}: storage {_f(b.get('storage_s'))} s ({b.get('reading_nodes', '?')} reading "
                         f"nodes), compute {_f(b.get('compute_s'))} s, serial {_f(b.get('serial_s'))} s")
        lines.append("")
        rat = doc.get("ratios") or {}
        names = {"dualpath_speedup_over_basic": "dualpath speed-up over basic (basic JCT / dualpath JCT)",
                 "dualpath_over_oracle": "dualpath JCT / oracle JCT",
                 "dualpath_read_bytes_max_over_avg": "dualpath storage bytes read per node, max / avg"}
        lines += [f"- {names[k]}: {_f(v, 'x', 2)}" for k, v in rat.items()] + ([""] if rat else [])
    if online:
        slo = online[0]["slo"]
        lines += [f"## Online (Poisson arrivals; SLO TTFT <= {slo['ttft_s']} s, TPOT <= {slo['tpot_s'] * 1000:g} ms, "
                  f"target {slo['target']:.0%})", "",
                  "| mode | APS | TTFT p50 s | TTFT p99 s | TTST p50 s | TPOT p50 ms | TPOT p99 ms | SLO attainment "
                  "| hit ratio | turns | errors |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(online, key=lambda r: (r["mode"], r["aps"] or 0)):
            lines.append(f"| {_name(r)} | {_f(r['aps'], '', 3)} | {_f(r['ttft_p50_s'])} | {_f(r['ttft_p99_s'])} "
                         f"| {_f(r['ttst_p50_s'])} | {_f(_ms(r['tpot_p50_s']), '', 1)} | {_f(_ms(r['tpot_p99_s']), '', 1)} "
                         f"| {r['slo_attainment']:.1%} | {_f(r['hit_ratio'])} | {r['turns']} | {r['errors']} |")
        lines.append("")
    from dualpath.bench.hints import markdown as hint_lines

    lines += hint_lines(doc)
    errs = [f"- {r['mode']}" + (f" @{r['aps']:g} APS" if r.get("aps") else "") + f": {e}"
            for r in doc["runs"] for e in r.get("error_samples") or []]
    if errs:
        lines += ["## Failed turns (samples)", ""] + errs + [""]
    if doc.get("search"):
        lines += ["## Capacity at SLO (highest APS meeting the target)", ""]
        lines += [f"- {m}: {_f(v, ' APS', 3)}" for m, v in doc["search"].items()]
        lines.append("")
    if doc.get("data_plane"):
        from shared.transport.bench import lines as data_plane_lines

        lines += ["## Data plane (python -m shared.transport.bench)", "", "```"] + data_plane_lines(doc["data_plane"]) \
            + ["```", ""]
    if doc.get("plots"):
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in doc["plots"]] + [""]
    return "\n".join(lines)


def _name(r: dict) -> str:
    """The run's mode, and its agent-hint policy when it has one other than off."""
    return r["mode"] + (f" (hints {r['hints']})" if r.get("hints", "off") != "off" else "")


def _ms(v):
    return None if v is None or v != v else v * 1000


def write_json(doc: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=2, allow_nan=False, default=_nan_free) + "\n")


def _nan_free(o):
    raise TypeError(f"not JSON: {type(o).__name__}")


def clean(obj):
    """nan / inf -> None, recursively (JSON has no NaN)."""
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def plots(doc: dict, out_dir: str | Path) -> list[str]:
    """Write the PNGs that the runs have data for; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    offline = [r for r in doc["runs"] if r["kind"] == "offline"]
    online = [r for r in doc["runs"] if r["kind"] == "online"]
    if offline:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        modes = [r["mode"] for r in offline]
        ax.bar(modes, [r["jct_s"] for r in offline], color="tab:blue", label="measured JCT")
        bounds = [r.get("jct_lower_bound_s") for r in offline]
        if any(b is not None for b in bounds):
            ax.scatter(modes, [b if b is not None else float("nan") for b in bounds], color="black", marker="_",
                       s=600, label="lower bound", zorder=3)
        ax.set_ylabel("JCT (s)")
        ax.set_title("Offline JCT by mode")
        ax.legend()
        written.append(_save(fig, out / "jct_by_mode.png", plt))
    if online:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
        for mode in dict.fromkeys(r["mode"] for r in online):
            rs = sorted((r for r in online if r["mode"] == mode), key=lambda r: r["aps"])
            x = [r["aps"] for r in rs]
            a1.plot(x, [r["ttft_p50_s"] for r in rs], "o-", label=f"{mode} p50")
            a1.plot(x, [r["ttft_p99_s"] for r in rs], "x--", label=f"{mode} p99")
            a2.plot(x, [_ms(r["tpot_p50_s"]) for r in rs], "o-", label=f"{mode} p50")
        slo = online[0]["slo"]
        a1.axhline(slo["ttft_s"], color="red", lw=0.8)
        a2.axhline(slo["tpot_s"] * 1000, color="red", lw=0.8)
        a1.set(xlabel="agents per second", ylabel="TTFT (s)", title="TTFT vs APS")
        a2.set(xlabel="agents per second", ylabel="TPOT (ms)", title="TPOT vs APS")
        a1.legend(fontsize=7)
        a2.legend(fontsize=7)
        written.append(_save(fig, out / "ttft_tpot_vs_aps.png", plt))
    last = {r["mode"]: r for r in doc["runs"] if r.get("storage_series")}  # one panel per mode: its last run
    series = list(last.values())
    if series:
        fig, axes = plt.subplots(1, len(series), figsize=(4 * len(series), 3.2), squeeze=False)
        for ax, r in zip(axes[0], series):
            for node, pts in sorted(r["storage_series"].items()):
                ax.plot([p[0] for p in pts], [p[1] / 1e6 for p in pts], label=node)
            ax.set(title=f"{r['mode']}" + (f" @{r['aps']:g} APS" if r.get("aps") else ""), xlabel="s",
                   ylabel="MB read (cumulative)")
            ax.legend(fontsize=7)
        written.append(_save(fig, out / "storage_read_bytes.png", plt))
    return written


def _save(fig, path: Path, plt) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)


def write_report(doc: dict, out_dir: str | Path) -> str:
    """report.md + report.json + the PNGs into out_dir; returns the markdown."""
    out = Path(out_dir)
    doc["plots"] = plots(doc, out)
    text = markdown(doc)
    (out / "report.md").write_text(text)
    write_json(doc, out / "report.json")
    return text
