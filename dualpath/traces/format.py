"""The trajectory JSONL format: one trajectory per line.

    {"id": "t0", "turns": [[608, 148], [430, 160], ...]}

`turns` is a list of [append, gen] pairs of positive token counts (append may be 0
after the first turn; gen >= 1). Optional "max_len" records the trace's cap. Owns
parsing, validation (errors name the file and line) and writing; knows nothing about
how trajectories are generated or replayed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable


class TraceFormatError(ValueError):
    """A bad line in a trajectory file."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One agent's turns: ((append, gen), ...)."""

    id: str
    turns: tuple[tuple[int, int], ...]
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def total_tokens(self) -> int:
        return sum(a + g for a, g in self.turns)

    def prompts(self) -> list[int]:
        """Prompt length of every turn (context before it plus its append)."""
        out, ctx = [], 0
        for a, g in self.turns:
            out.append(ctx + a)
            ctx += a + g
        return out

    def to_json(self) -> str:
        obj = {"id": self.id, "turns": [list(t) for t in self.turns], **self.meta}
        return json.dumps(obj, separators=(",", ":"))


def parse_line(text: str, path: str = "<string>", line: int = 1) -> Trajectory:
    """One JSONL line -> Trajectory; raises TraceFormatError naming `path:line`."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, line, f"not JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise TraceFormatError(path, line, "expected an object with 'id' and 'turns'")
    turns = obj.get("turns")
    if not isinstance(turns, list) or not turns:
        raise TraceFormatError(path, line, "'turns' must be a non-empty list of [append, gen]")
    parsed = tuple(_parse_turn(t, i, path, line) for i, t in enumerate(turns))
    if parsed[0][0] < 1:
        raise TraceFormatError(path, line, "turn 0: the first append must be >= 1 token")
    meta = {k: v for k, v in obj.items() if k not in ("id", "turns")}
    return Trajectory(str(obj.get("id", f"line{line}")), parsed, meta)


def _parse_turn(t: object, i: int, path: str, line: int) -> tuple[int, int]:
    ok = isinstance(t, (list, tuple)) and len(t) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in t)
    if not ok:
        raise TraceFormatError(path, line, f"turn {i}: expected [append, gen] integers, got {t!r}")
    a, g = t  # type: ignore[misc]
    if a < 0 or g < 1:
        raise TraceFormatError(path, line, f"turn {i}: need append >= 0 and gen >= 1, got [{a}, {g}]")
    return a, g


def read_jsonl(path: str | Path, parse, what: str) -> list:
    """`parse(text, path, line)` of every non-blank line; an empty file is an error naming `what`."""
    p = str(path)
    out = []
    with open(p, encoding="utf-8") as fh:
        for n, text in enumerate(fh, start=1):
            if text.strip():
                out.append(parse(text, p, n))
    if not out:
        raise TraceFormatError(p, 0, f"no {what} in file")
    return out


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """All trajectories of a JSONL file (blank lines skipped)."""
    return read_jsonl(path, parse_line, "trajectories")


def write_trajectories(path: str | Path, trajs: Iterable[Trajectory]) -> int:
    """Write one line per trajectory; returns how many were written."""
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for t in trajs:
            fh.write(t.to_json() + "\n")
            n += 1
    return n
