"""How much of a prompt is already stored: key its full blocks, ask a storage-gateway.

Owns the hit lookup done when a request arrives (and again when it is resumed): the
prompt's block keys under the engines' store layout, then either the oracle's own index
(oracle mode: no store is touched) or one `HitQuery` to any storage-gateway. No gateway
answering means every block is a miss, never an error.
"""
from __future__ import annotations

from typing import Awaitable, Callable

from opentelemetry import trace

from services.scheduler.inflight import InFlight
from services.scheduler.oracle import OracleIndex
from shared.bus import BusError
from shared.engine.store_layout import prompt_keys
from shared.messages.codes import LoadMode
from shared.messages.storage_gateway import HitQuery, HitReply

tracer = trace.get_tracer("scheduler")
Ask = Callable[[HitQuery], Awaitable[HitReply]]  # one request to any storage-gateway (raises BusError)


async def lookup_hits(rec: InFlight, layout, oracle: OracleIndex, ask: Ask,
                      known: Callable[[list[bytes]], int] | None = None,
                      buffered: Callable[[list[bytes]], int] | None = None) -> None:
    """Set `rec.block_keys` and `rec.hit_blocks` (the leading keys present in the store).
    `known(keys)`: leading keys known stored without a lookup (a session's prefetched turn), 0: ask.
    `buffered(keys)`: leading keys a buffer holds (a finished turn's blocks its DE kept, written
    or not): hits whatever the store says."""
    if layout is None:
        return
    if not rec.block_keys and not rec.remote_prompt:  # a front-door worker keyed it already (or has the ids)
        rec.block_keys = prompt_keys(layout, rec.work_prompt)
    if not rec.block_keys:
        return
    if rec.mode == LoadMode.ORACLE:  # no store: the oracle's own index of what would be stored
        rec.hit_blocks = oracle.hits(rec.block_keys)
        return
    if known is not None and (staged := known(rec.block_keys)):
        rec.hit_blocks = staged  # its prefix was prefetched: no gateway round trip before the assignment
        return
    with tracer.start_as_current_span("hit_lookup", context=rec.ctx,
                                      attributes={"req_id": rec.req_id, "blocks": len(rec.block_keys)}) as span:
        try:
            rec.hit_blocks = (await ask(HitQuery(layout, rec.block_keys))).blocks
        except BusError as exc:
            span.set_attribute("error", exc.reason)  # no gateway: everything is a miss
        if buffered is not None:
            rec.hit_blocks = max(rec.hit_blocks, buffered(rec.block_keys))
        span.set_attribute("hit_blocks", rec.hit_blocks)
