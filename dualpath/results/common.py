"""What every results section shares: the run record it must carry, its header lines, table cells.

A report without its date, machine, load average or command is refused, naming the file and the key.
"""
from __future__ import annotations

import math
from pathlib import Path

from shared.benchrun import QUIET_LOAD

REQUIRED = ("date", "machine", "load_start", "load_end", "command")  # under "conditions"
MACHINE = ("cpu", "cores", "memory_gib")
GLOSSARY = "[glossary](../../README.md#glossary)"


class ReportError(ValueError):
    pass  # a report the pages cannot use: the message names the file and what is wrong


def check_record(path: Path, doc) -> dict:
    """The report's "conditions" record, refused when a required key is missing or empty."""
    cond = doc.get("conditions") if isinstance(doc, dict) else None
    if not isinstance(cond, dict):
        raise ReportError(f"{path}: no \"conditions\" record (the date, machine, load average and command of the "
                          "run); rerun the tool with this version, which writes it")
    for key in REQUIRED:
        if cond.get(key) in (None, "", [], {}):
            raise ReportError(f"{path}: no \"conditions.{key}\" (a report needs {', '.join(REQUIRED)}); "
                              "rerun the tool with this version, which writes it")
    for key in MACHINE:
        if cond["machine"].get(key) in (None, ""):
            raise ReportError(f"{path}: no \"conditions.machine.{key}\" (the machine needs {', '.join(MACHINE)})")
    return cond


def header(cond: dict) -> list[str]:
    """The run's line and its command; not quiet by the record's own verdict (shared/benchrun.py),
    or, in a record without one, by a load average above 1.5."""
    m = cond["machine"]
    usable = f", {m['usable_cores']} usable" if m.get("usable_cores") not in (None, m["cores"]) else ""
    start, end, others = cond["load_start"][0], cond["load_end"][0], cond.get("others_load")
    beyond = f" ({others:.2f} beyond its own work)" if end > QUIET_LOAD and others is not None else ""
    line = (f"{cond['date']} · {m['cpu']}, {m['cores']} cores{usable}, {num(m['memory_gib'], 1)} GiB · "
            f"load average {start:.2f} → {end:.2f}{beyond} · CPU {num(cond.get('cpu_s'), 1)} s over "
            f"{num(cond.get('wall_s'), 1)} s wall")
    why = cond["flagged"] if "flagged" in cond else (
        f"load average {max(start, end):.2f} (> {QUIET_LOAD})" if max(start, end) > QUIET_LOAD else "")
    if why:
        line += f" · **not a quiet run**: {why}"
    fence = "sh" if cond["command"].startswith(".venv/bin/") else "text"  # a runnable command, or as recorded
    return [line, "", f"```{fence}", cond["command"], "```", ""]

def num(v, digits: int = 2, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return "n/a"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:.{digits}f}{unit}" if isinstance(v, float) else f"{v}{unit}"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows] + [""]

