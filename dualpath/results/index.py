"""The results index (docs/results/README.md): the pages, their reports, and how each report is made."""
from __future__ import annotations

from dualpath.results.common import GLOSSARY, table
from dualpath.sim.config import SGLANG
from shared.messages.codes import LoadMode

SIM_MODES = ",".join((LoadMode.BASIC, LoadMode.DUALPATH, LoadMode.ORACLE, SGLANG))

OUT = "docs/results/data"
RECIPES = [  # (report, command, how long on 2 cores)
    ("bench-tiny", f".venv/bin/dualpath bench --up --model tiny --snic-gbit 0.1 --trace gen:32k --agents 12 "
                   f"--scale 0.06 --max-turns 8 --offline --repeat 3 --json {OUT}/bench-tiny.json", "~1.5 min"),
    ("bench-smollm2", f".venv/bin/dualpath bench --up --model smollm2 --snic-gbit 0.05 --trace gen:32k --agents 8 "
                      f"--scale 0.03 --max-turns 6 --kv-blocks 512 --buffer-mb 1024 "
                      f"--set scheduler.pe-beta-tokens=32768 --offline --repeat 3 --json {OUT}/bench-smollm2.json",
     "~10-18 min"),
    ("bench-hints", f".venv/bin/dualpath bench --up --model tiny --snic-gbit 0.1 --trace gen:32k --agents 6 "
                    f"--scale 0.05 --max-turns 6 --offline --tool-calls 0.5 --hints on "
                    f"--modes {LoadMode.DUALPATH},{LoadMode.ORACLE} --repeat 5 --json {OUT}/bench-hints.json", "~2 min"),
    ("bench-online-tiny", f".venv/bin/dualpath bench --up --model tiny --snic-gbit 0.05 --trace gen:32k --agents 12 "
                          f"--scale 0.2 --max-turns 6 --search-aps --modes {LoadMode.BASIC},{LoadMode.DUALPATH} --slo-ttft 2 "
                          f"--slo-tpot 0.05 --min-turns 120 --min-seconds 60 --aps-start 0.25 "
                          f"--json {OUT}/bench-online-tiny.json", "~25 min"),
    ("sim-2p4d", f".venv/bin/dualpath sim --topology 2P4D --trace gen:64k --agents 200 --offline "
                 f"--modes {SIM_MODES} --json {OUT}/sim-2p4d.json", "~1 min"),
    ("sim-reproduce", f".venv/bin/dualpath sim --reproduce --json {OUT}/sim-reproduce.json", "~27 min"),
    ("sim-reproduce-quick", f".venv/bin/dualpath sim --reproduce --quick --no-online "
                            f"--json {OUT}/sim-reproduce-quick.json", "~3 min"),
    ("fleet", f".venv/bin/python -m dualpath.bench.fleet --engines 96 384 1152 --load 0.02 --warmup-s 10 "
              f"--measure-s 20 --idle-s 8 --json {OUT}/fleet.json", "~8 min"),
    ("fleet-core", f".venv/bin/python -m dualpath.bench.fleet --core-only --engines 1152 --load 1.0 --warmup-s 10 "
                   f"--measure-s 20 --idle-s 8 --json {OUT}/fleet-core.json", "~1.5 min"),
    ("chaos", f".venv/bin/python -m dualpath.bench.chaos --repeats 3 --json {OUT}/chaos.json", "~3 min a repeat"),
    ("mutants", "make mutants", "~30 min"),
]


def page(found: dict[str, list[str]], titles: dict[str, str]) -> str:
    """The index: a row per page with its reports (or "no reports yet"), then the commands that make them."""
    lines = ["# Results", "",
             f"Figures measured by this project's tools (terms: {GLOSSARY}), generated from their JSON",
             "reports: each report with its date, the machine, the load average at its start and end (a run above",
             "1.5 is flagged), its CPU and wall time, and the command that made it. `make results` writes the",
             "pages from [data/](data/); `.venv/bin/python -m dualpath.results --check` fails when one is stale.", ""]
    if found:
        lines += table(["page", "reports"], [[f"[{titles[k]}]({k}.md)", ", ".join(
            f"[{s}]({k}.md#{s})" for s in stems)] for k, stems in found.items()])
    else:
        lines += ["No reports yet: data/ holds none. The commands below make them.", ""]
    lines += ["## Making the reports", "",
              "One at a time on an otherwise idle machine, from the repository root; then `make results`, and",
              "commit data/ with the pages. A report's name starts with its kind (bench, sim, fleet, chaos, mutants).", "",
              "```sh"]
    lines += [f"{cmd}  # {took}" for _, cmd, took in RECIPES]
    return "\n".join(lines + ["```", ""])
