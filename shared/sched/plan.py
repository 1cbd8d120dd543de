"""KV plan builders, one per load mode: hits, the read-path decision and staging as block ranges.

Pure; the scheduler's placement calls `build`. Staged blocks (a prefetch, a kept turn) are layered
in front of the reads by `with_buffer`."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shared.messages.codes import LoadMode
from shared.messages.plan import KvPlan, KvRange, Source, StagedSlots


@dataclass(frozen=True)
class PlanEnds:
    """The request's two engines and their nodes."""

    pe: str
    pe_node: str
    de: str
    de_node: str


@dataclass(frozen=True)
class InBuffer:
    """Leading hit blocks a TM buffer holds already: a prefetch, or a finished turn kept."""

    blocks: int
    engine: str
    owner: str
    slots: StagedSlots | None = None  # the PE copies them itself (its own TM's buffer, or one on its host)


@dataclass(frozen=True)
class PlanInput:
    prompt_blocks: int  # the prompt's blocks, a partial last one included
    hits: int  # leading hit blocks worth loading (the prompt's last token is always computed)
    stored: int  # leading blocks the store holds (or a buffer keeps on their way there)
    ends: PlanEnds
    pe_read: int = 0  # hit blocks past the buffered ones read on the PE path (the read-path decision)
    buffered: InBuffer | None = None


def _reads(i: PlanInput, pe_read: int) -> list[KvRange]:
    """Past the buffered blocks: `pe_read` blocks on the PE path, the other hits on the DE path, then compute."""
    s = i.buffered.blocks if i.buffered is not None else 0
    e, out, mid = i.ends, [], min(s + pe_read, i.hits)
    if mid > s:
        out.append(KvRange(s, mid, Source.STORE, node=e.pe_node, engine=e.pe))
    if i.hits > mid:
        out.append(KvRange(mid, i.hits, Source.STORE, node=e.de_node, engine=e.de))
    return out + _compute(i)


def _compute(i: PlanInput) -> list[KvRange]:
    start = max(i.hits, 0)
    return [KvRange(start, i.prompt_blocks, Source.COMPUTE)] if i.prompt_blocks > start else []


def with_buffer(ranges: list[KvRange], b: InBuffer | None) -> list[KvRange]:
    """`ranges` (from the first unbuffered block on) behind the buffered blocks' range."""
    if b is None or b.blocks <= 0:
        return ranges
    return [KvRange(0, b.blocks, Source.BUFFER, engine=b.engine, owner=b.owner, slots=b.slots)] + ranges


def basic(i: PlanInput) -> KvPlan:
    """Every hit not buffered read on the PE path."""
    return KvPlan(with_buffer(_reads(i, i.hits), i.buffered), stored=i.stored)


def dualpath(i: PlanInput) -> KvPlan:
    """Every hit not buffered on the one path the decision chose (the shorter read queue)."""
    return KvPlan(with_buffer(_reads(i, i.pe_read), i.buffered), stored=i.stored)


def dualpath_split(i: PlanInput) -> KvPlan:
    """The hits not buffered split: the first `pe_read` on the PE path, the rest on the DE path."""
    return KvPlan(with_buffer(_reads(i, i.pe_read), i.buffered), stored=i.stored)


def oracle(i: PlanInput) -> KvPlan:
    """No KV moves: the hits are taken as present, nothing is pushed or saved (an upper bound)."""
    present = [KvRange(0, i.hits, Source.PRESENT)] if i.hits > 0 else []
    return KvPlan(present + _compute(i), push=False, persist=False, stored=i.stored)


BUILDERS: dict[LoadMode, Callable[[PlanInput], KvPlan]] = {
    LoadMode.BASIC: basic, LoadMode.DUALPATH: dualpath, LoadMode.DUALPATH_SPLIT: dualpath_split,
    LoadMode.ORACLE: oracle}


def build(mode: LoadMode | str, i: PlanInput) -> KvPlan:
    return BUILDERS[LoadMode(mode)](i)


def prompt_blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)
