"""The benchmark's outputs: a markdown report, the JSON document and PNG plots.

Plots: JCT by mode (offline), TTFT/TPOT against APS (online), bytes read per node over time.
Owns formatting only.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from dualpath.bench.metrics import run_name as _name
from dualpath.bench.metrics import summary
from dualpath.bench.tiers import markdown as tier_lines
from dualpath.bench.vllm_metrics import SECTIONS as VLLM_SECTIONS
from shared.messages.codes import LoadMode


def _f(v, unit: str = "", digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.{digits}f}{unit}" if isinstance(v, float) else f"{v}{unit}"


def _mb(b: float) -> str:
    return f"{b / 1e6:.2f}"


TERM_NAMES = {"storage_read_s": "storage read", "storage_write_s": "storage write", "prefill_s": "prefill compute",
              "decode_s": "decode compute", "engines_cores_s": "engines on shared cores", "cpu_s": "host CPU",
              "data_plane_s": "data plane", "serial_s": "serial chain"}


def _sp(s: dict | None, unit: str = "", digits: int = 3) -> str:
    """median [min-max] of a spread (just the median for one run)."""
    if not s or s.get("median") is None:
        return "n/a"
    if s["n"] <= 1 or s["min"] == s["max"]:
        return _f(s["median"], unit, digits)
    return f"{_f(s['median'], unit, digits)} [{_f(s['min'], '', digits)}-{_f(s['max'], '', digits)}]"


def markdown(doc: dict) -> str:
    cfg = doc.get("config", {})
    lines = [f"# dualpath bench: {doc.get('trace', '?')}", ""]
    lines.append(", ".join(f"{k}={v}" for k, v in cfg.items() if v not in (None, "")))
    lines.append("")
    summ = doc.get("summary") or summary(doc["runs"])
    if summ.get("offline"):
        lines += _offline(doc, summ)
    online = [r for r in doc["runs"] if r["kind"] == "online"]
    if online:
        lines += _online(online)
    lines += _vllm(doc["runs"])
    lines += tier_lines(doc)
    from dualpath.bench.hints import markdown as hint_lines

    lines += hint_lines(doc)
    errs = [f"- {r['mode']}" + (f" @{r['aps']:g} APS" if r.get("aps") else "") + f": {e}"
            for r in doc["runs"] for e in r.get("error_samples") or []]
    if errs:
        lines += ["## Failed turns (samples)", ""] + sorted(set(errs))[:12] + [""]
    if doc.get("search"):
        lines += _search(doc["search"])
    if doc.get("data_plane"):
        from shared.transport.bench import lines as data_plane_lines

        lines += ["## Data plane (python -m shared.transport.bench)", "", "```"] + data_plane_lines(doc["data_plane"]) \
            + ["```", ""]
    if doc.get("plots"):
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in doc["plots"]] + [""]
    return "\n".join(lines)


def _offline(doc: dict, summ: dict) -> list[str]:
    n = doc.get("config", {}).get("repeat") or 1
    what = f"medians of {n} runs [min-max]" if n > 1 else "one run"
    lines = [f"## Offline (all agents start together; closed loop per agent; {what})", "",
             "| mode | JCT s | lower bound s | JCT/bound | bound set by | simulator's prediction s "
             "| measured/predicted | measured/predicted, the probe's co-run alone | hit ratio | storage read max/avg |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m, v in summ["offline"].items():
        lines.append(f"| {m} | {_sp(v['jct_s'])} | {_sp(v['bound_s'])} | {_sp(v['jct_over_bound'], 'x', 2)} "
                     f"| {TERM_NAMES.get(v['limit'], v['limit'] or 'n/a')} | {_sp(v.get('predicted_jct_s'))} "
                     f"| {_sp(v.get('measured_over_predicted'), 'x', 2)} "
                     f"| {_sp(v.get('measured_over_probe_only'), 'x', 2)} | {_sp(v['hit_ratio'])} "
                     f"| {_sp(v['read_max_over_avg'], 'x', 2)} |")
    lines += ["", "Lower bound = the largest of its terms (seconds; medians), each a resource the run needs "
              "(dualpath/bench/bound.py):", "",
              "| mode | " + " | ".join(TERM_NAMES.values()) + " |", "|---" * (len(TERM_NAMES) + 1) + "|"]
    for m, v in summ["offline"].items():
        lines.append(f"| {m} | " + " | ".join(_f((v["terms"][k] or {}).get("median")) for k in TERM_NAMES) + " |")
    lines += _prediction(doc, summ)
    names = {"speedup": "speed-up (basic JCT / its JCT)", "bound_ratio": "ratio of the bounds (basic / its)",
             "of_bound_ratio": "speed-up / bound ratio", "jct_ratio": "JCT / oracle JCT"}
    for pair, vals in summ.get("pairs", {}).items():
        lines.append(f"- {pair}: " + "; ".join(f"{names[k]} {_sp(s, 'x', 2)}" for k, s in vals.items()))
    if summ.get("hit_ratio_spread") is not None:
        lines.append(f"- hit ratios of the modes lie within {summ['hit_ratio_spread']:.3f} of each other")
    nodes = {}
    for r in doc["runs"]:
        if r["kind"] == "offline":
            for node, b in r["storage_read_bytes_per_node"].items():
                nodes.setdefault(_name(r), {}).setdefault(node, []).append(b)
    lines += [""] + [f"- storage MB read per node, {m} (median): " + " ".join(
        f"{node}:{_mb(sorted(bs)[len(bs) // 2])}" for node, bs in sorted(per.items())) for m, per in nodes.items()]
    return lines + [""]


def _prediction(doc: dict, summ: dict) -> list[str]:
    """The rates the prediction took, its co-run slowdowns and the modes' measured/predicted without shared cores."""
    lines = ["", "Prediction: `dualpath sim` replaying the same turns on a cluster of this mesh's shape, fitted "
             "to the probed rates (dualpath/sim/calibrate.py).", ""]
    pr = (doc.get("prediction") or {}).get("rates")
    if not pr:
        return lines
    lines += [f"- probed: prefill {pr['prefill_tok_s']:.0f} tok/s + {pr['turn_overhead_s'] * 1e3:.0f} ms a "
              f"turn; decode step {pr['decode_step_s'] * 1e3:.1f} ms + {pr['decode_per_seq_s'] * 1e3:.1f} ms "
              f"per further sequence + {pr.get('decode_per_ctx_s', 0.0) * 1e6:.2f} us per context token; "
              f"KV {pr['kv_bytes_per_token']:.0f} B/token; storage NIC "
              f"{(pr['snic_bytes_s'] or 0) / 1e6:.1f} MB/s per node; data plane "
              f"{pr['data_plane_bytes_s'] / 1e9:.2f} GB/s; alpha {pr['alpha_tokens']}, beta "
              f"{pr['beta_tokens']} tokens; KV path's CPU {pr.get('kv_cpu_s_per_byte', 0.0) * 1e9:.1f} ns "
              f"per storage byte, taken from the node's engine; {pr.get('host_cores', 0)} cores shared by "
              f"the engines, {pr.get('background_cores', 0.0):.2f} of them kept busy by the rest of the mesh; "
              + _corun_text(doc, pr), ""]
    without = {m: _sp(v.get("measured_over_no_sharing"), "x", 2) for m, v in summ["offline"].items()
               if (v.get("measured_over_no_sharing") or {}).get("median") is not None}
    if without:
        lines += ["- measured/predicted without shared cores (the KV path and each engine on cores of its own): "
                  + "; ".join(f"{m} {s}" for m, s in without.items()), ""]
    return lines


def _corun_text(doc: dict, pr: dict) -> str:
    """How much slower each engine computes beside the other: the probe's, and what each repeat took."""
    each = (doc.get("prediction") or {}).get("corun_by_repeat")
    if each is None:  # an older report: raised to what all its oracle runs computed (in sample)
        return (f"beside the other engine a prefill takes {pr.get('corun_prefill_slow', 1.0):.2f}x, a decode "
                f"step {pr.get('corun_decode_slow', 1.0):.2f}x its time alone (dualpath/sim/hostcpu.py; the "
                f"probe's {probed_corun(doc)}, raised to what the oracle runs' engines computed where more)")
    return (f"beside the other engine a prefill and a decode step take {probed_corun(doc)} their time alone as "
            f"probed (dualpath/sim/hostcpu.py); each repeat's prediction raises these, where more, to what the "
            f"oracle runs of the OTHER repeats computed (one repeat: the probe's alone): {corun_taken(each)}")


def corun_taken(each: dict) -> str:
    """"repeat 0 1.50x / 1.20x, ...": the co-run slowdowns (prefill / decode step) each repeat's prediction took."""
    return ", ".join(f"repeat {k} {p:.2f}x / {d:.2f}x" for k, (p, d) in sorted(each.items(), key=lambda x: int(x[0])))


def probed_corun(doc: dict) -> str:
    pr = (doc.get("prediction") or {}).get("probe") or {}
    return f"{pr.get('corun_prefill_slow', 1.0):.2f}x / {pr.get('corun_decode_slow', 1.0):.2f}x"


def _online(online: list[dict]) -> list[str]:
    slo = online[0]["slo"]
    lines = [f"## Online (Poisson arrivals; SLO: steady mean TTFT <= {slo['ttft_s']} s and TPOT <= "
             f"{slo['tpot_s'] * 1000:g} ms, after the first {slo.get('warmup', 0.2):.0%} of turns)", "",
             "| mode | APS | repeat | turns | TTFT mean s | TTFT p99 s | TPOT mean ms | TPOT p99 ms | attainment "
             "| holds | failed | hit ratio | errors |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(online, key=lambda r: (r["mode"], r["aps"] or 0, r.get("repeat", 0))):
        lines.append(f"| {_name(r)} | {_f(r['aps'], '', 3)} | {r.get('repeat', 0)} | {r['turns']} "
                     f"| {_f(r.get('ttft_steady_mean_s'))} | {_f(r['ttft_p99_s'])} "
                     f"| {_f(_ms(r.get('tpot_steady_mean_s')), '', 1)} | {_f(_ms(r['tpot_p99_s']), '', 1)} "
                     f"| {r['slo_attainment']:.1%} | {'yes' if r.get('slo_holds') else 'no'} "
                     f"| {r.get('slo_failed') or '-'} | {_f(r['hit_ratio'])} | {r['errors']} |")
    return lines + [""]


def _search(search: dict) -> list[str]:
    lines = ["## Capacity at the SLO (highest APS whose level holds; bisected)", ""]
    for m, s in search.items():
        lo, hi = s["bracket"]
        lines.append(f"- {m}: {_f(s['capacity_aps'], ' APS', 3)} (next level that failed: {_f(hi, ' APS', 3)})")
        for lv in s["levels"]:
            lines.append(f"  - @{lv['aps']:.3g}: {'holds' if lv['holds'] else 'fails (' + lv['failed'] + ')'}, "
                         f"{lv['turns']} turns, TTFT mean {_sp(lv['ttft_mean_s'])} s, TPOT mean "
                         f"{_sp(lv['tpot_mean_s'], '', 4)} s, attainment {_sp(lv['attainment'], '', 2)}")
    base = search.get(LoadMode.BASIC.value, {}).get("capacity_aps")
    for m in (LoadMode.DUALPATH.value, LoadMode.DUALPATH_SPLIT.value):
        if base and search.get(m, {}).get("capacity_aps"):
            lines.append(f"- {m} / {LoadMode.BASIC.value} capacity: {search[m]['capacity_aps'] / base:.2f}x")
    return lines + [""]

def _vllm(runs: list[dict]) -> list[str]:
    """Each run's vLLM-named figures, laid out as `vllm bench serve` prints them."""
    blocks = [line for r in runs if "completed" in r for line in _vllm_block(r)]
    if not blocks:
        return []
    return ["## The same runs in vLLM's terms (`vllm bench serve`'s sections; its keys in each run's JSON)", "",
            "```"] + blocks + ["```", ""]


def _vllm_block(r: dict) -> list[str]:
    """One run as `vllm bench serve` prints its result (with a line naming the run)."""
    def row(name: str, v) -> str:
        return f"{name:<40} " + (f"{v:<10.2f}" if isinstance(v, float) else f"{'n/a' if v is None else v:<10}").rstrip()

    run = f"{_name(r)} {r['kind']}" + (f" @{r['aps']:g} APS" if r.get("aps") else "") + f", repeat {r.get('repeat', 0)}"
    out = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="), row("Run:", run),
           row("Successful requests:", r["completed"]), row("Benchmark duration (s):", r["duration"]),
           row("Total input tokens:", r["total_input_tokens"]),
           row("Total generated tokens:", r["total_output_tokens"]),
           row("Request throughput (req/s):", r["request_throughput"])]
    if r.get("request_goodput") is not None:
        out.append(row("Request goodput (req/s):", r["request_goodput"]))
    out += [row("Output token throughput (tok/s):", r["output_throughput"]),
            row("Total Token throughput (tok/s):", r["total_token_throughput"])]
    for key, short, header in VLLM_SECTIONS:
        out += ["{s:{c}^{n}}".format(s=header, n=50, c="-"), row(f"Mean {short} (ms):", r[f"mean_{key}_ms"]),
                row(f"Median {short} (ms):", r[f"median_{key}_ms"])]
        out += [row(f"P{k[1:-len(key) - 4]} {short} (ms):", v) for k, v in r.items()
                if k.startswith("p") and k.endswith(f"_{key}_ms") and k[1:2].isdigit()]
    return out + ["=" * 50]


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
        written.append(_save(_jct_figure(doc, plt), out / "jct_by_mode.png", plt))
    if online:
        written.append(_save(_online_figure(online, plt), out / "ttft_tpot_vs_aps.png", plt))
    fig = storage_figure(doc, plt)
    if fig is not None:
        written.append(_save(fig, out / "storage_read_bytes.png", plt))
    return written


def _jct_figure(doc: dict, plt):
    fig, ax = plt.subplots(figsize=(5, 3.5))
    per = (doc.get("summary") or {}).get("offline") or {}
    modes = list(per)
    ax.bar(modes, [per[m]["jct_s"]["median"] for m in modes], color="tab:blue", label="measured JCT (median)")
    bounds = [per[m]["bound_s"]["median"] for m in modes]
    if any(b is not None for b in bounds):
        ax.scatter(modes, [b if b is not None else float("nan") for b in bounds], color="black", marker="_",
                   s=600, label="lower bound", zorder=3)
    ax.set_ylabel("JCT (s)")
    ax.set_title("Offline JCT by mode")
    ax.legend()
    return fig


def _online_figure(online: list[dict], plt):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
    for mode in dict.fromkeys(r["mode"] for r in online):
        rs = sorted((r for r in online if r["mode"] == mode), key=lambda r: r["aps"])
        x = [r["aps"] for r in rs]
        a1.plot(x, [r.get("ttft_steady_mean_s") for r in rs], "o", label=f"{mode} mean")
        a1.plot(x, [r["ttft_p99_s"] for r in rs], "x", label=f"{mode} p99")
        a2.plot(x, [_ms(r.get("tpot_steady_mean_s")) for r in rs], "o", label=f"{mode} mean")
    slo = online[0]["slo"]
    a1.axhline(slo["ttft_s"], color="red", lw=0.8)
    a2.axhline(slo["tpot_s"] * 1000, color="red", lw=0.8)
    a1.set(xlabel="agents per second", ylabel="TTFT (s)", title="TTFT vs APS")
    a2.set(xlabel="agents per second", ylabel="TPOT (ms)", title="TPOT vs APS")
    a1.legend(fontsize=7)
    a2.legend(fontsize=7)
    return fig


def storage_figure(doc: dict, plt):
    """MB read per node over time, one panel per mode, one y axis; None when no run has a series."""
    last = {r["mode"]: r for r in doc["runs"] if r.get("storage_series")}
    if not last:
        return None
    roles = (doc.get("config") or {}).get("node_roles") or {}
    fig, axes = plt.subplots(1, len(last), figsize=(4 * len(last), 3.2), squeeze=False, sharey=True)
    for ax, r in zip(axes[0], last.values()):
        labels = {node: node_label(node, roles) for node in r["storage_series"]}
        for node in sorted(labels, key=lambda n: ("(decode)" in labels[n], n)):  # prefill nodes first
            pts = r["storage_series"][node]
            ax.plot([p[0] for p in pts], [p[1] / 1e6 for p in pts], label=labels[node])
        ax.set(title=f"{r['mode']}" + (f" @{r['aps']:g} APS" if r.get("aps") else ""), xlabel="s")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("MB read (cumulative)")
    axes[0][0].set_ylim(bottom=0)
    return fig


def node_roles(mesh: dict) -> dict[str, str]:
    """{node: "prefill" | "decode"} from the engines a mesh document (GET /v1/mesh) lists."""
    return {e["node"]: e["role"] for e in mesh.get("engines", []) if e.get("node") and e.get("role")}


def node_label(node: str, roles: dict[str, str]) -> str:
    """"p0 (prefill)": the node and its role from `roles`, else guessed from the name; else the name alone."""
    role = roles.get(node) or next((r for r in ("prefill", "decode") if node == r or re.fullmatch(
        rf"{r[0]}\d+", node)), None)
    return f"{node} ({role})" if role and role != node else node


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
