"""The sim page's sections: `dualpath sim --reproduce` (published beside simulated) and plain runs.

The gap and its 15% flag are the reproduction's own (dualpath/sim/reproduce.py).
"""
from __future__ import annotations

from shared.messages.codes import LoadMode

from pathlib import Path

from dualpath.results.common import GLOSSARY, num, table

TITLE = "Simulator: the paper's figures and cluster runs"
INTRO = [f"Each section is one `dualpath sim` report (terms: {GLOSSARY}).",
         "A reproduction (`--reproduce`) puts each figure the paper publishes beside the simulated one, with the",
         "gap; a gap over 15% is starred and its reason, worked out from the runs' own figures, follows the table.",
         "A plain run gives per mode the JCT, TTFT, TPOT and the storage NIC balance of a simulated cluster."]


def lines(doc: dict) -> list[str]:
    return reproduce(doc) if "rows" in doc else runs(doc)


def reproduce(doc: dict) -> list[str]:
    from dualpath.sim.reproduce import FLAG, QUICK, gap

    rows, notes = [], []
    comparable = doc.get("comparable", True)
    for exp, metric, pub_text, sim, pub, why in doc["rows"]:
        sim = None if sim is None or sim != sim else sim  # NaN: not simulated
        g = gap(sim, pub)
        star = comparable and (sim is None or (g is not None and abs(g) > FLAG))
        gap_s = "" if g is None else (f"{g * 100:+.0f}%" if comparable else "n/c")
        rows.append([exp, metric.strip(), pub_text, num(sim), gap_s, "*" if star else ""])
        if star and why:
            notes.append(f"- {exp} {metric.strip()}: {' '.join(str(why).split())}")
    out = [f"{len(doc.get('runs') or [])} simulator runs."
           + (f" Engines at {doc['prefill_eff']:g} (prefill) and {doc['decode_eff']:g} (decode) of the kernels' "
              f"published rates, the one fitted input." if "prefill_eff" in doc else ""), ""]
    if not comparable:
        out += [QUICK[0].upper() + QUICK[1:] + ".", ""]
    out += [f"- {line}" for line in doc.get("regime", [])] + ([""] if doc.get("regime") else [])
    out += table(["", "metric", "published", "simulated", "gap", ""], rows)
    if notes:
        out += [f"\\* gap over {FLAG:.0%}, or not simulated:", ""] + notes + [""]
    return out


def runs(doc: dict) -> list[str]:
    c = doc.get("config") or {}
    basic = next((r["jct_s"] for r in doc["runs"] if r["mode"] == LoadMode.BASIC and r.get("hints", "off") == "off"), None)
    rows = [[r["mode"] + (f" (hints {r['hints']})" if r.get("hints", "off") != "off" else ""), num(r["jct_s"], 0),
             f"{basic / r['jct_s']:.2f}x" if basic and r.get("jct_s") else "-",
             f"{num(r.get('ttft_p50_s'))} / {num(r.get('ttft_p90_s'))}",
             num((r.get("tpot_p50_s") or 0.0) * 1e3, 1), num(r.get("snic_max_over_avg")),
             num(r.get("attn_max_over_avg"), 3)] for r in doc["runs"]]
    setup = (f"Setup: {c.get('model', '?')} on {c.get('hardware', '?')}, {c.get('P', '?')}P{c.get('D', '?')}D, "
             f"trace {c.get('trace', '?')}, {c.get('agents', '?')} agents, "
             + (f"{c['aps']:g} APS." if c.get("aps") else "offline."))
    return [setup, ""] + table(["mode", "JCT s", "speed-up over basic", "TTFT p50 / p90 s", "TPOT p50 ms",
                                "storage NIC read max/avg", "attention max/avg"], rows)


def plots(doc: dict, out: Path) -> list[str]:
    if "rows" not in doc:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dualpath.sim.reproduce import FLAG, gap

    got = [(f"{exp} {metric.strip()}"[:48], gap(sim, pub)) for exp, metric, _, sim, pub, _ in doc["rows"]]
    got = [(name, g * 100) for name, g in got if g is not None and g == g]
    if not got:
        return []
    fig, ax = plt.subplots(figsize=(7, 0.28 * len(got) + 1.2))
    ax.axvspan(-FLAG * 100, FLAG * 100, color="0.9")
    ax.barh(range(len(got)), [g for _, g in got], color=["tab:red" if abs(g) > FLAG * 100 else "tab:blue"
                                                          for _, g in got])
    ax.set_yticks(range(len(got)), [n for n, _ in got], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="simulated vs published (%)", title="Gap to the published figures")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "gaps.png", dpi=90)
    plt.close(fig)
    return ["gaps.png"]
