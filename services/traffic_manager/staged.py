"""A fetch's prefetched blocks: which buffer holds them, claiming them, and giving them back.

The layer-by-layer copies are fetch.py's."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from services.traffic_manager.parts import TMParts
from shared.bus import BusError
from shared.messages.endpoints import EP
from shared.messages.traffic_manager import PENDING_OWNER, Claim, Claimed, FetchKV, ReadFinished, Release
from shared.transport.base import Op, TrafficClass
from shared.transport.grants import Grant, decode_grant

log = logging.getLogger("traffic_manager.fetch")


def adopts(p: TMParts, msg: FetchKV) -> bool:
    """Prefetched into the request's own DE's buffer: that TM adopts them (a kept turn's are claimed)."""
    return bool(msg.staged_owner and msg.staged_blocks > 0 and msg.staged_engine == msg.de_engine
                and msg.de_engine != p.cfg.engine and not msg.staged_owner.startswith(PENDING_OWNER))


async def claim(p: TMParts, msg: FetchKV) -> tuple[list[int], Grant | None]:
    """Buffer offsets of the leading blocks still staged for this fetch, with the holder's grant if remote."""
    n = min(msg.staged_blocks, len(msg.block_keys))
    if not msg.staged_owner or n <= 0:
        return [], None
    keys = msg.block_keys[:n]
    if msg.staged_engine == p.cfg.engine:
        return p.claim_local(msg.staged_owner, keys), None
    try:
        got = await p.bus.request(p.subjects.at(EP.TM_CLAIM, engine=msg.staged_engine), Claim(msg.staged_owner, keys),
                                  timeout=p.cfg.transfer_timeout_s, abort=p.peers_gone.future(msg.staged_engine))
    except BusError as exc:  # gone: its blocks are read from storage instead
        log.info("prefetched blocks of %s not claimed: %s", msg.req_id, exc.reason)
        return [], None
    grant = decode_grant(got.grant) if got.slots else None
    return (got.slots[:n], grant) if grant is not None else ([], None)


async def release(p: TMParts, msg: FetchKV) -> None:
    if msg.staged_engine == p.cfg.engine:
        p.drop_local(msg.staged_owner, "used")
        return
    try:
        await p.bus.publish(p.subjects.at(EP.TM_RELEASE, engine=msg.staged_engine), Release(msg.staged_owner))
    except BusError as exc:  # its TTL or claim lease frees them
        log.warning("release of prefetched %s not sent: %s", msg.staged_owner, exc.reason)


@dataclass(frozen=True)
class Held:
    """Where a fetch's prefetched blocks sit: `slots` claimed (under `grant`) or `adopted` in its DE's
    buffer."""

    slots: list[int]
    grant: Grant | None
    adopted: list[int]
    de_grant: Grant | None


async def copy_all(p: TMParts, msg: FetchKV, src: Held, prog, m_wait, de_slots: list[int], de_hits: list[int]) -> None:
    """Every hit was prefetched: all layers go into KV memory in one copy, then `ReadFinished(layers=n)`.
    A failed copy comes before it, so the engine computes the prompt instead."""
    lay = p.pool.layout
    lb, bn, xfer, dst = lay.layer_block_nbytes, lay.block_nbytes, p.cfg.transfer_timeout_s, msg.dst_blocks
    ops = [(off + layer * lb, dst[i] * bn + layer * lb) for layer in range(lay.n_layers)
           for i, off in enumerate(src.adopted or src.slots)]
    t0 = time.perf_counter()
    if not src.adopted and msg.staged_engine == p.cfg.engine:
        await p.endpoint.copy_local([Op("buf", b, "kv", k, lb) for b, k in ops], TrafficClass.LATENCY, timeout=xfer)
    else:  # one-sided, under the grant of exactly those slots
        engine, grant = (msg.de_engine, src.de_grant) if src.adopted else (msg.staged_engine, src.grant)
        peer = await p.peer(engine)
        await peer.read([Op("kv", k, "buf", b, lb) for b, k in ops], TrafficClass.LATENCY, timeout=xfer, grant=grant)
    prog.layers = lay.n_layers
    n = len(src.adopted or src.slots)
    await p.bus.publish(p.loaded_subject, ReadFinished(msg.req_id, n, layers=lay.n_layers, staged=n,
                                                       de_slots=de_slots if de_hits else [], de_hits=de_hits))
    prog.read = True
    if src.adopted or msg.staged_engine == p.cfg.engine:  # kinds as the layer-by-layer copy counts them
        p.m_bytes.labels("de_path_pull" if src.adopted else "h2d_layers").inc(bn * n)
    p.m_bytes.labels("prefetch_used").inc(n * bn)
    m_wait.labels("h2d").observe(time.perf_counter() - t0)
