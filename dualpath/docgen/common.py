"""What the reference-page generators share: where pages go, their heading, table cells."""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
GLOSSARY = "[glossary](../../README.md#glossary)"


def heading(title: str, source: str, lines: Iterable[str] = ()) -> list[str]:
    """A page's title and the line saying where it comes from (then any `lines` of its own)."""
    return [f"# {title}", "", f"Generated from {source} by `python -m dualpath.docgen --write` (`make docs`); "
            f"do not edit by hand. Abbreviations: {GLOSSARY}.", "", *lines]


def cell(text: object) -> str:
    """`text` on one line, safe inside a markdown table cell."""
    return re.sub(r"\s+", " ", str(text)).strip().replace("|", "\\|")


def code(text: object) -> str:
    """`text` as inline code ('' for nothing)."""
    text = cell(text)
    return f"`{text}`" if text else ""


def table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> list[str]:
    """A markdown table: `header` names, then one line per row (cells already formatted)."""
    header = list(header)
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out + [""]
