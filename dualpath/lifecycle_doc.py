"""The generated parts of docs/concepts/request-lifecycle.md: every state machine's states and legal moves.

    python -m dualpath.lifecycle_doc          # print them
    python -m dualpath.lifecycle_doc --write  # put them into the doc between their markers
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "concepts" / "request-lifecycle.md"
MACHINES = [  # (what moves through it, module, its enum, its legal-move table: {state: moves} or {kind: {state: moves}})
    ("a request at the scheduler", "services.scheduler.lifecycle", "ReqState", "LEGAL"),
    ("a request at the prefill engine", "services.prefill_engine.life", "PeState", "LEGAL"),
    ("a request at the decode engine", "services.decode_engine.states", "DeState", "LEGAL"),
    ("a transfer at a traffic manager", "services.traffic_manager.transfers", "TransferState", "LEGAL"),
]
BEGIN, END = "<!-- generated: states -->", "<!-- end generated: states -->"


def machines() -> list[tuple[str, type, dict[str, dict]]]:
    """(title, enum, {kind: legal table}) of every machine; a machine of one kind has the kind ""."""
    out = []
    for what, module, enum_name, table in MACHINES:
        m = importlib.import_module(module)
        enum, legal = getattr(m, enum_name), getattr(m, table)
        kinds = legal if all(isinstance(v, dict) for v in legal.values()) else {"": legal}
        out.append((what, enum, kinds))
    return out


def _names(enum: type, states) -> str:
    return ", ".join(f"`{s}`" for s in enum if s in states)


def machine_markdown(what: str, enum: type, kinds: dict[str, dict]) -> list[str]:
    """One machine: each live state's own moves, then the moves every live state shares and the final states."""
    live = [moves for legal in kinds.values() for moves in legal.values() if moves]
    common = set.intersection(*map(set, live)) if len(live) > 1 else set()
    finals = {s for legal in kinds.values() for s, moves in legal.items() if not moves}

    def own(legal: dict) -> list[str]:
        return [f"`{s}` → {_names(enum, set(legal[s]) - common) or '(only the shared moves)'}"
                for s in enum if legal.get(s)]

    lines = [f"### {enum.__name__}: {what} (`{enum.__module__}`)", ""]
    for kind, legal in kinds.items():
        lines += [f"- {kind}: " + "; ".join(own(legal))] if kind else [f"- {m}" for m in own(legal)]
    shared = f"Every live state may also move to {_names(enum, common)}. " if common else ""
    return lines + ["", f"{shared}Final: {_names(enum, finals)}.", ""]


def states_markdown() -> str:
    lines = [line for machine in machines() for line in machine_markdown(*machine)]
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
