"""The mutants page's sections: `make mutants` reports, the score per module, survivors, equivalents."""
from __future__ import annotations

from pathlib import Path

from dualpath.results.common import GLOSSARY, table

TITLE = "Mutants: the mutation score"
INTRO = ["Each section is one `make mutants` report: mutmut's mutants of the scheduling policy, the dispatcher,",
         "block keys and format, the traffic manager's fetch/push/progress, the prefill engine's hand-off, decode",
         "persistence and the planner, run against the unit and model tiers. Mutants checked from 2026-12-06 on ran",
         "without the simulator's two end-to-end files (test_sim_runs, test_sim_online: minutes per mutant), so",
         "a mutant only those would kill counts as a survivor there. The score is the share killed among",
         "the mutants checked (a run cut short leaves some unchecked); equivalent ones, no test can tell from the",
         f"original, are left out and listed with why (terms: {GLOSSARY})."]


def lines(doc: dict) -> list[str]:
    mods = doc["modules"]
    rows = [[f"`{r['module']}`", r["mutants"], r["counted"], r["killed"], r["equivalent"], f"{r['score']:.1%}"]
            for r in mods]
    rows.append(["all", *(sum(r[k] for r in mods) for k in ("mutants", "counted", "killed", "equivalent")),
                 f"{doc['score']:.1%}"])
    out = table(["module", "mutants", "checked", "killed", "equivalent", "score"], rows)
    if doc["survivors"]:
        out += [f"{len(doc['survivors'])} survivors: their names are in the report's JSON (data/), and "
                "`make mutants` prints each with the `mutmut show` command that shows its change.", ""]
    if doc.get("equivalent"):
        out += ["Equivalent:", ""] + [f"- `{n}`: {why}" for n, why in doc["equivalent"].items()] + [""]
    return out


def plots(doc: dict, out: Path) -> list[str]:
    return []  # the table is the figure
