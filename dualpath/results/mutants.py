"""The mutants page's sections: `make mutants` reports, the score per module, survivors, equivalents."""
from __future__ import annotations

from pathlib import Path

from dualpath.results.common import table

TITLE = "Mutants: the mutation score"
INTRO = ["Each section is one `make mutants` report: mutmut's mutants of the scheduling policy, the dispatcher,",
         "block keys and format, the traffic manager's fetch/push/progress, the prefill engine's hand-off, decode",
         "persistence and the planner, run against the unit and model tiers. The score is the share killed among",
         "the mutants counted; the equivalent ones (no test can tell them from the original) are listed with why."]


def lines(doc: dict) -> list[str]:
    rows = [[f"`{r['module']}`", r["mutants"], r["killed"], r["equivalent"], f"{r['score']:.1%}"]
            for r in doc["modules"]]
    rows.append(["all", sum(r["mutants"] for r in doc["modules"]), sum(r["killed"] for r in doc["modules"]),
                 sum(r["equivalent"] for r in doc["modules"]), f"{doc['score']:.1%}"])
    out = table(["module", "mutants", "killed", "equivalent", "score"], rows)
    if doc["survivors"]:
        out += ["Survivors:", ""] + [f"- `{s['mutant']}` ({s['status']})" for s in doc["survivors"]] + [""]
    if doc.get("equivalent"):
        out += ["Equivalent:", ""] + [f"- `{n}`: {why}" for n, why in doc["equivalent"].items()] + [""]
    return out


def plots(doc: dict, out: Path) -> list[str]:
    return []  # the table is the figure
