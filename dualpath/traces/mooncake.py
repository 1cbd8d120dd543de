"""Importer of the public Mooncake trace format: one request per JSONL line.

`hash_ids` name the prompt's blocks; `prompt_tokens` maps each to a fixed block of token ids,
so requests sharing a hash-id prefix share exactly that token prefix.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
import numpy as np

from dualpath.traces.format import decode_line, read_jsonl

MOONCAKE_BLOCK = 512  # tokens per hash id in the published traces


NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]


class MooncakeRequest(msgspec.Struct, frozen=True):
    """One request of the trace; decoding checks every field (ranges, types, hash cover)."""

    timestamp_ms: NonNegative = msgspec.field(name="timestamp")  # arrival, ms
    input_length: Positive
    output_length: Positive
    hash_ids: tuple[NonNegative, ...]  # one per MOONCAKE_BLOCK prompt tokens

    def __post_init__(self) -> None:
        if len(self.hash_ids) * MOONCAKE_BLOCK < self.input_length - MOONCAKE_BLOCK:
            raise ValueError(f"{len(self.hash_ids)} hash_ids cannot cover input_length {self.input_length}")


def parse_line(text: str, path: str = "<string>", line: int = 1) -> MooncakeRequest:
    """One line -> MooncakeRequest; raises TraceFormatError naming `path:line` and the field."""
    return decode_line(text, MooncakeRequest, path, line)


def read_mooncake(path: str | Path) -> list[MooncakeRequest]:
    return read_jsonl(path, parse_line, "requests")


def block_size_for(scale: float, align: int = 64) -> int:
    """Tokens per hash id after scaling: a multiple of `align` so stored blocks still line up."""
    return max(align, int(round(MOONCAKE_BLOCK * scale / align)) * align)


def prompt_tokens(req: MooncakeRequest, index: int, lo: int, hi: int, salt: int = 0,
                  scale: float = 1.0) -> list[int]:
    """The request's prompt: hash id h -> fixed ids in [lo, hi) (seeded by salt, h); the rest its own."""
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
