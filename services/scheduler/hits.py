"""How much of a prompt is stored: key its full blocks; a worker's count, the prefetcher's, or a gateway's answer.

No gateway answering means every block is a miss, never an error."""
from __future__ import annotations

from typing import Awaitable, Callable

from opentelemetry import trace

from services.scheduler.inflight import InFlight
from services.scheduler.oracle import OracleIndex
from shared.bus import BusError
from shared.engine.store_layout import prompt_keys
from shared.messages.codes import LoadMode
from shared.messages.endpoints import EP
from shared.messages.storage_gateway import HitQuery, HitReply

tracer = trace.get_tracer("scheduler")
Ask = Callable[[HitQuery], Awaitable[HitReply]]  # one request to any storage-gateway (raises BusError)


def asker(bus, subjects) -> Ask:
    async def ask(query: HitQuery) -> HitReply:
        return await bus.request(subjects.at(EP.SG_HIT), query, timeout=2.0)
    return ask


def known_hits(rec: InFlight, layout, oracle: OracleIndex,
               known: Callable[[list[bytes]], int] | None = None,
               buffered: Callable[[list[bytes]], int] | None = None) -> bool:
    """Set `rec.block_keys` and `rec.hit_blocks` where no gateway need be asked; False: ask one."""
    if layout is None:
        return True
    if not rec.block_keys and not rec.remote_prompt:  # a front-door worker keyed it already (or has the ids)
        rec.block_keys = prompt_keys(layout, rec.work_prompt)
    if not rec.block_keys:
        return True
    if rec.mode == LoadMode.ORACLE:  # no store: the oracle's own index of what would be stored
        rec.hit_blocks = oracle.hits(rec.block_keys)
        return True
    if known is not None and (staged := known(rec.block_keys)):
        rec.hit_blocks = staged  # its prefix was prefetched: no gateway round trip before the assignment
        return True
    if rec.stored_blocks >= 0:  # the front-door worker asked the store just before it submitted
        rec.hit_blocks = max(rec.stored_blocks, buffered(rec.block_keys) if buffered is not None else 0)
        return True
    return False


async def lookup_hits(rec: InFlight, layout, oracle: OracleIndex, ask: Ask,
                      known: Callable[[list[bytes]], int] | None = None,
                      buffered: Callable[[list[bytes]], int] | None = None) -> None:
    """Set `rec.block_keys` and `rec.hit_blocks`, asking a gateway where `known_hits` cannot tell."""
    if known_hits(rec, layout, oracle, known, buffered):
        return
    rec.hit_blocks = await stored_blocks(rec.block_keys, layout, ask, rec.ctx, rec.req_id)
    if buffered is not None:
        rec.hit_blocks = max(rec.hit_blocks, buffered(rec.block_keys))


async def stored_blocks(keys: list[bytes], layout, ask: Ask, ctx, req_id: str) -> int:
    """The leading `keys` a gateway says are stored (0: none answered)."""
    with tracer.start_as_current_span("hit_lookup", context=ctx,
                                      attributes={"req_id": req_id, "blocks": len(keys)}) as span:
        try:
            n = (await ask(HitQuery(layout, list(keys)))).blocks
        except BusError as exc:
            n = 0
            span.set_attribute("error", exc.reason)  # no gateway: everything is a miss
        span.set_attribute("hit_blocks", n)
    return n
