"""The fleet page's sections: `python -m dualpath.bench.fleet` reports, its table and a plot."""
from __future__ import annotations

from pathlib import Path

from dualpath.results.common import GLOSSARY, table

TITLE = "Fleet: the scheduler among emulated engines"
INTRO = [f"Each section is one `python -m dualpath.bench.fleet` report (terms: {GLOSSARY}).",
         "One row per fleet size: a real scheduler and NATS around emulated engines at a share of the paper's",
         "per-engine agent load; requests assigned per second, the time from arrival to assignment (p50/p99),",
         "the scheduler's CPU per request and in cores, the bus's messages, and the CPU of everything else on",
         "the machine."]


def _columns(doc: dict):
    from dualpath.bench.fleet import COLUMNS, CORE_COLUMNS

    return CORE_COLUMNS if doc.get("core_only") else COLUMNS


def _cell(fmt: str, v) -> str:
    try:
        return fmt.format(v)
    except (TypeError, ValueError):
        return "n/a"


def lines(doc: dict) -> list[str]:
    cols = _columns(doc)
    rows = [[_cell(fmt, r.get(key)) for _, key, fmt in cols] for r in doc["rows"]]
    what = "the dispatch core alone (`--core-only`)" if doc.get("core_only") else "the whole scheduler"
    return [f"{len(rows)} fleet size{'s' if len(rows) != 1 else ''}, {what}.", ""] + table([c[0] for c in cols], rows)


def plots(doc: dict, out: Path) -> list[str]:
    rows = sorted((r for r in doc["rows"] if r.get("assign_p50_ms") is not None), key=lambda r: r["engines"])
    if not rows:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    x = [r["engines"] for r in rows]
    for key, label in (("assign_p50_ms", "p50"), ("assign_p99_ms", "p99")):
        ax.plot(x, [r.get(key) for r in rows], "o-", label=label)
    ax.set(xlabel="engines", ylabel="arrival to assignment (ms)", title="Assignment time by fleet size")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "assign_ms.png", dpi=90)
    plt.close(fig)
    return ["assign_ms.png"]
