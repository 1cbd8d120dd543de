"""Plain-text tables and number formatting for `dualpath plan` (no calculations)."""
from __future__ import annotations

from typing import Sequence

Cell = str | int | float


def fmt(value: Cell, digits: int = 3) -> str:
    if isinstance(value, bool) or isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    if value == int(value) and abs(value) < 1e6:
        return f"{int(value):,}"
    return f"{value:.{digits}g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:.{digits}f}"


def size(nbytes: float) -> str:
    """Human bytes in decimal units (GB = 1e9), matching vendor bandwidth units."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} B"


def render(headers: Sequence[str], rows: Sequence[Sequence[Cell]], title: str = "") -> str:
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    line = "  ".join("-" * w for w in widths)
    out = [title] if title else []
    out.append("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    out.append(line)
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(out)


def pairs(items: Sequence[tuple[str, Cell]], title: str = "") -> str:
    """Key: value lines, keys aligned."""
    width = max(len(k) for k, _ in items)
    out = [title] if title else []
    out += [f"  {k.ljust(width)}  {fmt(v)}" for k, v in items]
    return "\n".join(out)
