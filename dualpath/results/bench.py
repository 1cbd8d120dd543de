"""The bench page's sections: a `dualpath bench` report's setup, offline and online figures, plots.

Figures and plots are the report's own (dualpath/bench/report.py), from the same JSON.
"""
from __future__ import annotations

from pathlib import Path

from dualpath.bench import hints
from dualpath.bench.metrics import run_name, spread, summary
from dualpath.bench.report import TERM_NAMES, corun_taken, node_label, probed_corun
from dualpath.results.common import GLOSSARY, num, table
from shared.messages.codes import LoadMode

TITLE = "Bench: a real mesh on this machine"
INTRO = [f"Each section is one `dualpath bench` report (terms: {GLOSSARY}).",
         "Offline, all agents start together: per mode the JCT beside its physical lower bound (the largest",
         "of the resources the run needed, and which one set it), TTFT and TPOT percentiles, storage MB read per",
         "node, and the simulator's prediction from the rates the bench probed on the mesh (each repeat's co-run",
         "slowdowns raised to what the other repeats' oracle runs measured: out of sample); medians when a report",
         "repeated its runs. Online, Poisson arrivals: per mode and load level the percentiles, the SLO",
         "attainment and whether the level held."]


def lines(doc: dict) -> list[str]:
    doc.setdefault("summary", summary(doc["runs"]))
    out = [setup(doc), ""]
    if doc["summary"].get("offline"):
        out += offline(doc)
    online = [r for r in doc["runs"] if r["kind"] == "online"]
    if online:
        out += online_table(online)
    if doc.get("search"):
        out += capacity(doc["search"])
    return out + hints.markdown(doc)


def setup(doc: dict) -> str:
    c = doc.get("config") or {}
    snic = c.get("snic_gbit_s_per_node")
    parts = [f"model {c.get('model', '?')}", f"{c.get('prefill_nodes', '?')}P{c.get('decode_nodes', '?')}D",
             f"trace {doc.get('trace', '?')}", f"{c.get('agents', '?')} agents", f"scale {c.get('scale', '?')}",
             f"storage NIC {snic:g} Gbit/s per node" if snic else "storage NIC uncapped",
             f"{c.get('repeat') or 1} run{'s' if (c.get('repeat') or 1) > 1 else ''} per mode"]
    return "Setup: " + ", ".join(parts) + "."


def _median(rows: list[dict], key: str):
    return spread(r.get(key) for r in rows)["median"]


def _ms(v):
    return None if v is None else v * 1e3


def offline(doc: dict) -> list[str]:
    by: dict[str, list[dict]] = {}
    for r in doc["runs"]:
        if r["kind"] == "offline":
            by.setdefault(run_name(r), []).append(r)
    roles = (doc.get("config") or {}).get("node_roles") or {}
    rows = [[m, num(v["jct_s"]["median"]), num(v["bound_s"]["median"]), num(v["jct_over_bound"]["median"], 2, "x"),
             TERM_NAMES.get(v.get("limit"), v.get("limit") or "n/a"),
             f"{num(_median(by.get(m, []), 'ttft_p50_s'))} / {num(_median(by.get(m, []), 'ttft_p99_s'))}",
             f"{num(_ms(_median(by.get(m, []), 'tpot_p50_s')), 1)} / "
             f"{num(_ms(_median(by.get(m, []), 'tpot_p99_s')), 1)}",
             _reads(by.get(m, []), roles), num((v.get("predicted_jct_s") or {}).get("median")), _over(v)]
            for m, v in doc["summary"]["offline"].items()]
    out = table(["mode", "JCT s", "bound s", "JCT/bound", "bound set by", "TTFT p50 / p99 s", "TPOT p50 / p99 ms",
                 "storage MB read per node", "simulator's JCT s", "measured/predicted (the probe's co-run alone)"],
                rows) + _corun(doc)
    names = {"speedup": "speed-up", "bound_ratio": "ratio of the bounds", "of_bound_ratio": "speed-up / bound ratio",
             "jct_ratio": "JCT ratio"}
    for pair, vals in (doc["summary"].get("pairs") or {}).items():
        out.append(f"- {pair}: " + "; ".join(f"{names.get(k, k)} {num(s['median'], 2, 'x')}" for k, s in vals.items()))
    return out + [""] if doc["summary"].get("pairs") else out


def _over(v: dict) -> str:
    """Median measured/predicted, and in brackets the same at the probe's co-run slowdowns alone."""
    got, alone = ((v.get(k) or {}).get("median") for k in ("measured_over_predicted", "measured_over_probe_only"))
    return num(got, 2, "x") + (f" ({num(alone, 2, 'x')})" if alone is not None else "")


def _corun(doc: dict) -> list[str]:
    """The co-run slowdowns the prediction took: the probe's, raised per repeat to the other repeats' oracle runs."""
    each = (doc.get("prediction") or {}).get("corun_by_repeat")
    if not each:
        return []
    return [f"Co-run slowdowns (prefill / decode step): the probe's {probed_corun(doc)}; each repeat's prediction "
            f"raises them to what the other repeats' oracle runs computed: {corun_taken(each)}.", ""]


def _reads(rows: list[dict], roles: dict) -> str:
    per = [r.get("storage_read_bytes_per_node") or {} for r in rows]
    nodes = sorted({n for p in per for n in p}, key=lambda n: ("(decode)" in node_label(n, roles), n))
    mb = {n: spread(p.get(n) for p in per)["median"] for n in nodes}
    return ", ".join(f"{node_label(n, roles)} {num(b / 1e6)}" for n, b in mb.items() if b is not None) or "n/a"


def online_table(online: list[dict]) -> list[str]:
    rows = [[run_name(r), num(r.get("aps"), 3), r.get("turns", "n/a"),
             f"{num(r.get('ttft_p50_s'))} / {num(r.get('ttft_p99_s'))}",
             f"{num(_ms(r.get('tpot_p50_s')), 1)} / {num(_ms(r.get('tpot_p99_s')), 1)}",
             num(r.get("slo_attainment"), 2), "yes" if r.get("slo_holds") else f"no ({r.get('slo_failed') or '?'})"]
            for r in sorted(online, key=lambda r: (run_name(r), r.get("aps") or 0, r.get("repeat", 0)))]
    slo = online[0].get("slo") or {}
    return [f"Online, SLO: steady mean TTFT ≤ {slo.get('ttft_s', '?')} s and TPOT ≤ "
            f"{num(_ms(slo.get('tpot_s')), 0)} ms.", ""] + table(
        ["mode", "APS", "turns", "TTFT p50 / p99 s", "TPOT p50 / p99 ms", "SLO attainment", "holds"], rows)


def capacity(search: dict) -> list[str]:
    caps = {m: s.get("capacity_aps") for m, s in search.items()}
    out = ["Capacity at the SLO (the highest APS whose level held): "
           + ", ".join(f"{m} {num(c, 3)} APS" for m, c in caps.items()) + "."]
    base = caps.get(LoadMode.BASIC)
    over = [f"{m} {c / base:.2f}x" for m, c in caps.items() if m != LoadMode.BASIC and c and base]
    if over:
        out.append("Over basic: " + ", ".join(over) + ".")
    return out + [""]


def plots(doc: dict, out: Path) -> list[str]:
    from dualpath.bench.report import plots as draw

    doc.setdefault("summary", summary(doc["runs"]))
    return [Path(p).name for p in draw(doc, out)]
