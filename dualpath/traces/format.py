"""The trajectory JSONL format: one trajectory per line.

    {"id": "t0", "turns": [[608, 148], [430, 160], ...], "tool_ms": [2300, ...]}

Owns parsing, validation (errors name file, line and field) and writing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Iterable

import msgspec


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
    tool_ms: tuple[int, ...] = ()  # the tool call after turn i (before turn i+1); () = none recorded

    def tool_s(self, i: int) -> float:
        """Seconds the tool call after turn `i` runs (0 after the last turn or when none is recorded)."""
        return self.tool_ms[i] / 1000 if i < len(self.tool_ms) else 0.0

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
        if self.tool_ms:
            obj["tool_ms"] = list(self.tool_ms)
        return json.dumps(obj, separators=(",", ":"))


Append = Annotated[int, msgspec.Meta(ge=0)]  # tokens a turn appends (0 allowed after the first)
Gen = Annotated[int, msgspec.Meta(ge=1)]  # tokens a turn generates
ToolMs = Annotated[int, msgspec.Meta(ge=0, le=86_400_000)]  # a tool call's duration: 0 .. a day


class TrajectoryLine(msgspec.Struct):
    """What one line must hold; other keys are kept as the trajectory's `meta`."""

    turns: Annotated[list[tuple[Append, Gen]], msgspec.Meta(min_length=1)]
    id: str | int | None = None
    tool_ms: list[ToolMs] | None = None

    def __post_init__(self) -> None:
        if self.turns[0][0] < 1:
            raise ValueError("turn 0: the first append must be >= 1 token")
        if self.tool_ms is not None and len(self.tool_ms) != len(self.turns) - 1:
            raise ValueError(f"tool_ms: one duration per gap between turns ({len(self.turns) - 1}), "
                             f"got {len(self.tool_ms)}")


def decode_line(text: str, type_: Any, path: str, line: int) -> Any:
    """One JSON line as `type_` (checked by msgspec); TraceFormatError naming `path:line` and the field."""
    try:
        return msgspec.json.decode(text, type=type_)
    except msgspec.ValidationError as exc:
        raise TraceFormatError(path, line, str(exc)) from None
    except msgspec.DecodeError as exc:
        raise TraceFormatError(path, line, f"not JSON ({exc})") from None


def parse_line(text: str, path: str = "<string>", line: int = 1) -> Trajectory:
    """One JSONL line -> Trajectory; raises TraceFormatError naming `path:line`."""
    obj = decode_line(text, dict[str, Any], path, line)
    try:
        parsed = msgspec.convert(obj, TrajectoryLine)
    except msgspec.ValidationError as exc:
        raise TraceFormatError(path, line, str(exc)) from None
    meta = {k: v for k, v in obj.items() if k not in ("id", "turns", "tool_ms")}
    name = f"line{line}" if parsed.id is None else str(parsed.id)
    return Trajectory(name, tuple(parsed.turns), meta, tuple(parsed.tool_ms or ()))


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
    return read_jsonl(path, parse_line, "trajectories")


def write_trajectories(path: str | Path, trajs: Iterable[Trajectory]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for t in trajs:
            fh.write(t.to_json() + "\n")
            n += 1
    return n
