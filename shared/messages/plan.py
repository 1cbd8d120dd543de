"""A request's KV plan: where each range of its prompt's blocks comes from, and what follows the prefill.

The scheduler builds it (shared/sched/plan.py); engines and traffic managers only execute it.
"""
from __future__ import annotations

from enum import StrEnum

import msgspec

from shared.messages.codes import ErrorCode


class Source(StrEnum):
    """Where a range of prompt blocks comes from."""

    STORE = "store"  # read through `node`'s storage NIC, landed by `engine`'s traffic manager
    BUFFER = "buffer"  # `engine`'s TM buffer holds them already, as `owner` (a prefetch, a kept turn)
    PRESENT = "present"  # taken as in the PE's KV memory already: nothing moves
    COMPUTE = "compute"  # the prefill engine computes them


LOADED = (Source.STORE, Source.BUFFER, Source.PRESENT)  # a tuple: `in` compares values (plain strings too)


class StagedSlots(msgspec.Struct, array_like=True, omit_defaults=True):
    """Where a prefetch sits in its TM's buffer, for that TM's own engine: valid while `record` holds `stamp`."""

    buffer: str  # the buffer's shared-memory name
    table: str  # the stamp table's shared-memory name
    record: int
    stamp: int
    slots: list[int]  # buffer byte offsets of the staged blocks, in prompt order


class KvRange(msgspec.Struct, omit_defaults=True):
    """Prompt blocks [start, end) and their source."""

    start: int
    end: int
    source: Source
    node: str = ""  # STORE: whose gateway reads them
    engine: str = ""  # STORE: whose TM lands them; BUFFER: whose TM buffer holds them
    owner: str = ""  # BUFFER: the name of those buffer slots
    slots: StagedSlots | None = None  # BUFFER: where they sit, when the PE may copy them itself


class KvPlan(msgspec.Struct, omit_defaults=True):
    ranges: list[KvRange] = []  # contiguous from block 0; blocks past the last range are computed
    push: bool = True  # the prompt's KV goes to the DE's buffer
    persist: bool = True  # the prompt's blocks the store lacks are saved
    stored: int = 0  # leading prompt blocks the store holds (or soon will): never saved again


class PlanError(ValueError):
    """A plan that cannot be executed: answered as `code`, never a crash."""

    code = ErrorCode.BAD_PLAN


def check(plan: KvPlan) -> None:
    """PlanError unless the ranges are non-empty, contiguous from block 0, and every load precedes compute."""
    at, computing = 0, False
    for r in plan.ranges:
        if r.start != at or r.end <= r.start:
            raise PlanError(f"range [{r.start}, {r.end}) does not follow block {at}")
        if computing and r.source in LOADED:
            raise PlanError(f"{r.source} range [{r.start}, {r.end}) after a computed one")
        if (r.source == Source.STORE and not r.engine) or (r.source == Source.BUFFER and not (r.engine and r.owner)):
            raise PlanError(f"{r.source} range [{r.start}, {r.end}) names no engine or owner")
        computing = computing or r.source == Source.COMPUTE
        at = r.end
    if plan.stored < 0:
        raise PlanError(f"stored blocks {plan.stored} < 0")


def loaded(plan: KvPlan) -> int:
    """Leading blocks loaded or present (not computed)."""
    end = 0
    for r in plan.ranges:
        if r.source not in LOADED:
            break
        end = r.end
    return end


def blocks(plan: KvPlan, source: Source, engine: str | None = None) -> int:
    """Blocks from `source` (and, given, `engine`)."""
    return sum(r.end - r.start for r in plan.ranges if r.source == source and engine in (None, r.engine))


def first(plan: KvPlan, source: Source) -> KvRange | None:
    return next((r for r in plan.ranges if r.source == source), None)
