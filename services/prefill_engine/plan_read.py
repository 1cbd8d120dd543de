"""What a request's KV plan asks of this prefill engine, in its fetch's terms (`FetchKV`).

Executable plans: present blocks alone, or buffered, PE-path and DE-path blocks in that order,
then computed ones; any other raises PlanError (answered as its ErrorCode)."""
from __future__ import annotations

from dataclasses import dataclass

from shared.messages.plan import KvRange, PlanError, Source, StagedSlots, check
from shared.messages.work import PrefillWork

PRESENT, BUFFER, PE_PATH, DE_PATH = range(4)  # the order loaded ranges must come in


@dataclass(frozen=True)
class PlanLoads:
    hits: int = 0  # leading prompt blocks loaded (or present); the rest is computed
    present: bool = False  # ... taken as in KV memory already: nothing moves
    staged: int = 0  # ... of them, leading blocks a TM buffer holds
    staged_engine: str = ""
    staged_owner: str = ""
    staged_slots: StagedSlots | None = None  # ... where, when this engine may copy them itself
    pe_blocks: int = 0  # ... leading blocks up to the PE path's end (staged ones included); the rest: DE path
    node: str = ""  # PE path: whose gateway reads ("": this engine's node)
    de_node: str = ""  # DE path: whose gateway reads
    stored: int = 0  # leading blocks the store holds: saved from there on


def plan_loads(work: PrefillWork, engine: str, block_size: int) -> PlanLoads:
    """The plan's loads, clamped to what the prompt allows (its last token is always computed)."""
    plan = work.plan
    check(plan)
    by: dict[int, KvRange] = {}
    ends = [0, 0, 0, 0]
    for r in plan.ranges:
        if r.source == Source.COMPUTE:
            break
        kind = _kind(r, engine, work.de_engine)
        seen = by.keys() | {kind}
        if kind < max(by, default=kind) or PRESENT in seen and len(seen) > 1:
            raise PlanError(f"{r.source} range [{r.start}, {r.end}) out of order for this engine")
        if kind in by and (by[kind].node, by[kind].engine, by[kind].owner) != (r.node, r.engine, r.owner):
            raise PlanError(f"{r.source} ranges of one path from two places")
        by.setdefault(kind, r)
        ends[kind] = r.end
    n = max(0, min(max(ends), len(work.block_keys), (len(work.prompt) - 1) // block_size))
    buf, pe, de = by.get(BUFFER), by.get(PE_PATH), by.get(DE_PATH)
    return PlanLoads(n, PRESENT in by, min(ends[BUFFER], n), buf.engine if buf else "", buf.owner if buf else "",
                     buf.slots if buf else None, min(max(ends[BUFFER], ends[PE_PATH]), n),
                     pe.node if pe else "", de.node if de else "", plan.stored)


def _kind(r: KvRange, engine: str, de_engine: str) -> int:
    if r.source == Source.PRESENT:
        return PRESENT
    if r.source == Source.BUFFER:
        return BUFFER
    if r.source == Source.STORE and r.engine == engine:
        return PE_PATH
    if r.source == Source.STORE and r.engine == de_engine:
        return DE_PATH
    raise PlanError(f"{r.source} range [{r.start}, {r.end}) landed by {r.engine!r}: neither this engine nor its DE")
