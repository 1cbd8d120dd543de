"""The running batch of a decode engine: sequences, their positions, and when they finish.

Pure: no torch, no I/O."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.engine.requests import EngineRequest
from shared.messages.codes import FinishReason
from shared.messages.work import DecodeAdmit


@dataclass(eq=False)
class DecodeRequest(EngineRequest):
    admit: DecodeAdmit | None = None  # the hand-off (buffer slots, prompt keys); None once loaded
    failed: str = ""  # why its background work failed (the error it ends with, unless cancelled)
    state: Any = None  # its `states.DeState` (written by `DeLife` alone)
    ending: Any = None  # the terminal state a STOPPING or PERSISTING request ends in
    span: Any = None  # its decode span once running (a move's trace event goes there)
    timer: Any = None  # its admission deadline (asyncio.TimerHandle) while it waits for KV blocks


@dataclass
class RunningSeq:
    req: EngineRequest
    pos: int  # KV of positions [0, pos) is in the cache; the next input sits at pos
    last: int  # the newest generated token (input of the next step)
    max_pos: int  # context limit for this sequence (blocks reserved up to here)
    stops: set[int] = field(default_factory=set)
    keys: list[bytes] = field(default_factory=list)  # store keys of the full blocks so far
    persist: bool = True  # save full blocks as they fill (off when the plan saves nothing)
    span: Any = None  # the request's decode span (OpenTelemetry), ended when it leaves

    def context(self, start: int, end: int) -> list[int]:
        """Token ids at positions [start, end) (prompt, then generated tokens)."""
        prompt = self.req.prompt
        full = prompt + self.req.generated
        return full[start:end] if end <= len(full) else full[start:]

    @property
    def index(self) -> int:
        """Index (in the generated sequence) of the token the next step produces."""
        return len(self.req.generated)


def finish_reason(seq: RunningSeq, token: int) -> FinishReason | None:
    """Why `seq` stops after producing `token` (None = keep going)."""
    if token in seq.stops:
        return FinishReason.STOP
    if len(seq.req.generated) >= seq.req.sampling.max_tokens:
        return FinishReason.LENGTH
    if seq.pos + 1 >= seq.max_pos:
        return FinishReason.LENGTH
    return None


def admit_order(waiting: list[EngineRequest], free_blocks: int, blocks_needed, room: int) -> list[EngineRequest]:
    """FIFO prefix of `waiting` that fits free KV blocks and the batch room."""
    chosen: list[EngineRequest] = []
    for req in waiting:
        need = blocks_needed(req)
        if len(chosen) >= room or need > free_blocks:
            break
        chosen.append(req)
        free_blocks -= need
    return chosen


def filled_block(seq: RunningSeq, block_size: int) -> int | None:
    """Index of the block that the last step completed, if it completed one."""
    if seq.pos % block_size == 0 and seq.pos // block_size - 1 >= len(seq.keys):
        return seq.pos // block_size - 1
    return None
