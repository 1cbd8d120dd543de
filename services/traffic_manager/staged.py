"""A fetch's prefetched blocks: which buffer holds them, claiming them, and giving them back.

A session's stored prefix may have been staged during its tool call (prefetch.py) in this
traffic-manager's buffer, in another's (then claimed over the bus: `Claim` -> `Claimed`, the
slots with a data-plane grant of exactly them) or in the request's own DE's buffer (then
adopted there by the fetch's `Reserve`: they become the prompt's first DE-buffer slots). Once
the fetch is over, the holder takes the slots back (`Release`). Answers only what a fetch
asks, and copies them in one go when every hit sits in this buffer (`copy_all`); the
layer-by-layer copies are fetch.py's.
"""
from __future__ import annotations

import logging
import time

from services.traffic_manager.parts import TMParts
from shared.bus import BusError
from shared.messages.traffic_manager import PENDING_OWNER, Claim, Claimed, FetchKV, ReadFinished, Release
from shared.transport.base import Op, TrafficClass
from shared.transport.grants import Grant, decode_grant

log = logging.getLogger("traffic_manager.fetch")


def adopts(p: TMParts, msg: FetchKV) -> bool:
    """Prefetched into the request's own DE's buffer (not this one): that TM adopts them (a kept
    turn's blocks, pending.py, are claimed instead: their reservation would be one the PE never uses)."""
    return bool(msg.staged_owner and msg.staged_blocks > 0 and msg.staged_engine == msg.de_engine
                and msg.de_engine != p.cfg.engine and not msg.staged_owner.startswith(PENDING_OWNER))


async def claim(p: TMParts, msg: FetchKV) -> tuple[list[int], Grant | None]:
    """Buffer offsets of the leading prefetched blocks still staged for this fetch ([]: none),
    with the holder's grant of them when the holder is another traffic-manager."""
    n = min(msg.staged_blocks, len(msg.keys))
    if not msg.staged_owner or n <= 0:
        return [], None
    keys = msg.keys[:n]
    if msg.staged_engine == p.cfg.engine:
        return p.claim_local(msg.staged_owner, keys), None
    try:
        got = await p.bus.request(p.subjects.tm(msg.staged_engine, "claim"), Claim(msg.staged_owner, keys),
                                  Claimed, timeout=p.cfg.transfer_timeout_s)
    except BusError as exc:  # gone: its blocks are read from storage instead
        log.info("prefetched blocks of %s not claimed: %s", msg.req_id, exc.reason)
        return [], None
    grant = decode_grant(got.grant) if got.slots else None
    return (got.slots[:n], grant) if grant is not None else ([], None)


async def release(p: TMParts, msg: FetchKV) -> None:
    """The prefetched slots are copied (or the fetch ended): their buffer takes them back."""
    if msg.staged_engine == p.cfg.engine:
        p.drop_local(msg.staged_owner, "used")
        return
    try:
        await p.bus.publish(p.subjects.tm(msg.staged_engine, "release"), Release(msg.staged_owner))
    except BusError as exc:  # its TTL or claim lease frees them
        log.warning("release of prefetched %s not sent: %s", msg.staged_owner, exc.reason)


async def copy_all(p: TMParts, msg: FetchKV, pairs: list[tuple[int, int]], prog, m_wait) -> None:
    """Every hit was prefetched into this buffer (pairs: buffer offset, KV block): nothing is read,
    so nothing overlaps the copy. Every layer goes into KV memory in one copy, and
    `ReadFinished(layers=n)` says so: no `LayersLoaded` follows, the engine computes without
    waiting on a layer. A failed copy comes before `ReadFinished`: the engine computes the prompt
    (its blocks are overwritten). `prog` is the fetch's Progress, `m_wait` its phase histogram."""
    lay = p.pool.layout
    lb, bn = lay.layer_block_nbytes, lay.block_nbytes
    t0 = time.perf_counter()
    ops = [Op("buf", off + layer * lb, "kv", b * bn + layer * lb, lb)
           for layer in range(lay.n_layers) for off, b in pairs]
    await p.endpoint.copy_local(ops, TrafficClass.LATENCY, timeout=p.cfg.transfer_timeout_s)
    prog.layers = lay.n_layers
    await p.bus.publish(p.loaded_subject, ReadFinished(msg.req_id, len(pairs), layers=lay.n_layers))
    prog.read = True
    p.m_bytes.labels("h2d_layers").inc(bn * len(pairs))
    p.m_bytes.labels("prefetch_used").inc(len(pairs) * bn)
    m_wait.labels("h2d").observe(time.perf_counter() - t0)
