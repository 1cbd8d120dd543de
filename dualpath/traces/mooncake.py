"""Importer of the public Mooncake trace format: one request per JSONL line.

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}

`timestamp` is the arrival in ms; `hash_ids` names the prompt's 512-token blocks in order
(equal ids = equal content; the last block may be partial). `prompt_tokens` maps each
hash id to a deterministic block of token ids, so two requests whose hash_ids share a
prefix share exactly that token prefix. Owns parsing (errors name the file and line) and
the id -> tokens mapping; knows nothing about replaying.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dualpath.traces.format import TraceFormatError, read_jsonl

MOONCAKE_BLOCK = 512  # tokens per hash id in the published traces


@dataclass(frozen=True, slots=True)
class MooncakeRequest:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def parse_line(text: str, path: str = "<string>", line: int = 1) -> MooncakeRequest:
    """One line -> MooncakeRequest; raises TraceFormatError naming `path:line`."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, line, f"not JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise TraceFormatError(path, line, "expected an object with timestamp, input_length, output_length, hash_ids")
    vals = {}
    for key, low in (("timestamp", 0), ("input_length", 1), ("output_length", 1)):
        v = obj.get(key)
        if not _is_int(v) or v < low:
            raise TraceFormatError(path, line, f"'{key}' must be an integer >= {low}, got {v!r}")
        vals[key] = v
    ids = obj.get("hash_ids")
    if not isinstance(ids, list) or not all(_is_int(h) and h >= 0 for h in ids):
        raise TraceFormatError(path, line, "'hash_ids' must be a list of non-negative integers")
    if len(ids) * MOONCAKE_BLOCK < vals["input_length"] - MOONCAKE_BLOCK:
        raise TraceFormatError(path, line, f"{len(ids)} hash_ids cannot cover input_length {vals['input_length']}")
    return MooncakeRequest(vals["timestamp"], vals["input_length"], vals["output_length"], tuple(ids))


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_mooncake(path: str | Path) -> list[MooncakeRequest]:
    """Every request of a Mooncake JSONL file, in file order (blank lines skipped)."""
    return read_jsonl(path, parse_line, "requests")


def block_size_for(scale: float, align: int = 64) -> int:
    """Tokens per hash id after scaling: a multiple of `align` so stored blocks still line up."""
    return max(align, int(round(MOONCAKE_BLOCK * scale / align)) * align)


def prompt_tokens(req: MooncakeRequest, index: int, lo: int, hi: int, salt: int = 0,
                  scale: float = 1.0) -> list[int]:
    """The request's prompt: hash id h -> a fixed block of ids in [lo, hi) (seeded by salt, h).

    With `scale` < 1 each hash id stands for fewer tokens (block_size_for) and the
    input length shrinks alike. Tokens beyond the hash ids' cover (rare) are unique to
    the request (seeded by its index), so they never fake a shared prefix.
    """
    block = block_size_for(scale) if scale != 1.0 else MOONCAKE_BLOCK
    length = max(1, round(req.input_length * block / MOONCAKE_BLOCK))
    out: list[int] = []
    for h in req.hash_ids:
        if len(out) >= length:
            break
        out.extend(np.random.default_rng([salt, 1, h]).integers(lo, hi, block).tolist())
    if len(out) < length:
        extra = np.random.default_rng([salt, 2, index]).integers(lo, hi, length - len(out)).tolist()
        out.extend(extra)
    return out[:length]


def output_length(req: MooncakeRequest, scale: float = 1.0) -> int:
    return max(1, round(req.output_length * scale))
