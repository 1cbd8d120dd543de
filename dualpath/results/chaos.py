"""The chaos page's sections: the fault-and-cancel matrix, cells passed per kind, action and phase."""
from __future__ import annotations

from pathlib import Path

from dualpath.bench.metrics import spread
from dualpath.results.common import num, table

TITLE = "Chaos: the fault-and-cancel matrix"
INTRO = ["Each section is one `python -m dualpath.bench.chaos` report: every process kind killed and frozen,",
         "and clients leaving, in each phase of a request (prefill, decode, persist). A cell passes when both",
         "its requests end (every token once and exact, or an error), nothing is left held, and the next request",
         "is served. The matrix counts passes over the repeats; detect and resume are medians in seconds."]


def lines(doc: dict) -> list[str]:
    cells = doc["cells"]
    columns = list(dict.fromkeys((c["action"], c["phase"]) for c in cells))
    rows = []
    for kind in dict.fromkeys(c["kind"] for c in cells):
        mine = [c for c in cells if c["kind"] == kind]
        row = [kind]
        for action, phase in columns:
            here = [c for c in mine if (c["action"], c["phase"]) == (action, phase)]
            row.append(f"{sum(c['passed'] for c in here)}/{len(here)}" if here else "")
        row += [num(spread(c["detect_s"] for c in mine if c["detect_s"] >= 0)["median"]),
                num(spread(c["resume_s"] for c in mine if c["resume_s"] >= 0)["median"])]
        rows.append(row)
    failed = [c for c in cells if not c["passed"]]
    out = [f"{len(cells) - len(failed)} of {len(cells)} cells passed.", ""]
    out += table(["kind"] + [f"{a} {p}" for a, p in columns] + ["detect s", "resume s"], rows)
    if failed:
        out += ["Failed cells:", ""] + [
            f"- {c['kind']} {c['action']} {c['phase']} #{c['repeat']}: stream {c['stream'] or '-'}; plain "
            f"{c['plain'] or '-'}; leaks {len(c.get('leaks') or [])}; next request "
            f"{'ok' if c.get('next_ok') else 'failed'}" for c in failed] + [""]
    return out


def plots(doc: dict, out: Path) -> list[str]:
    return []  # the matrix is the figure
