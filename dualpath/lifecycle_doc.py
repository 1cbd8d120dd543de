"""The generated parts of docs/request-lifecycle.md: every state machine's states and legal moves.

    python -m dualpath.lifecycle_doc          # print them
    python -m dualpath.lifecycle_doc --write  # put them into the doc between their markers
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "request-lifecycle.md"
MACHINES = [  # (what moves through it, module, its enum, its legal-move table: {state: moves} or {kind: {state: moves}})
    ("a request at the scheduler", "services.scheduler.lifecycle", "ReqState", "LEGAL"),
    ("a request at the prefill engine", "services.prefill_engine.life", "PeState", "LEGAL"),
    ("a request at the decode engine", "services.decode_engine.states", "DeState", "LEGAL"),
    ("a transfer at a traffic manager", "services.traffic_manager.transfers", "TransferState", "LEGAL"),
]
BEGIN, END = "<!-- generated: states -->", "<!-- end generated: states -->"


def machines() -> list[tuple[str, type, dict]]:
    """(title, enum, legal table) of every machine; a table per kind is one machine per kind."""
    out = []
    for what, module, enum_name, table in MACHINES:
        m = importlib.import_module(module)
        enum, legal = getattr(m, enum_name), getattr(m, table)
        if all(isinstance(v, dict) for v in legal.values()):  # one table per kind of transfer
            out += [(f"{what}: {kind}", enum, legal[kind]) for kind in legal]
        else:
            out.append((what, enum, legal))
    return out


def states_markdown() -> str:
    lines = []
    for what, enum, legal in machines():
        lines += [f"### {enum.__name__}: {what} (`{enum.__module__}`)", "", "| state | may move to |", "|---|---|"]
        for s in (s for s in enum if s in legal):
            to = ", ".join(f"`{t}`" for t in enum if t in legal[s]) or "— (final)"
            lines.append(f"| `{s}` | {to} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def spliced(text: str) -> str:
    """`text` with the part between the markers made anew."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{DOC}: markers {BEGIN} ... {END} not found")
    return pattern.sub(lambda _: f"{BEGIN}\n{states_markdown()}{END}", text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dualpath.lifecycle_doc", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write them into {DOC.name}")
    args = ap.parse_args(argv)
    if args.write:
        DOC.write_text(spliced(DOC.read_text()))
    else:
        sys.stdout.write(states_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
