"""The traffic-manager's storage paths: fetch hit blocks into KV memory layer by layer,
and save full blocks out of KV memory for persistence.

Fetch (PE path): buffer slots <- gateway reads Full Blocks (storage NIC) -> for each
layer l: Layer Blocks buffer -> KV memory (one batched copy), then `LayerLoaded(l)` to
the engine, which computes layer l while l+1.. are still being copied.
Save: KV memory -> buffer slots (bulk class) -> `SaveCopied` to the engine (its blocks
may be reused from then on) -> gateway writes each block in the background.
A request's slots are never freed while a gateway read or write still targets them.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from opentelemetry import trace

from shared.bus import BusError, Delivery
from shared.kv.allocator import OutOfSlots
from shared.messages.storage import ReadBlocks, ReadDone, WriteBlock, WriteDone
from shared.messages.tm import FetchKV, LayerLoaded, SaveCopied, SaveKV
from shared.transport.base import Op, TrafficClass

if TYPE_CHECKING:
    from services.traffic_manager.app import TrafficManagerService

log = logging.getLogger("tm.store")
tracer = trace.get_tracer("traffic-manager")


class StorePath:
    def __init__(self, svc: "TrafficManagerService"):
        self.svc = svc
        m = svc.metrics
        self.m_layer_wait = m.histogram("tm_fetch_seconds", "Storage read time of a fetch", ("phase",))
        self.m_saved = m.counter("tm_saved_blocks_total", "Blocks handed to the gateway for persistence",
                                 ("outcome",))

    # fetch -------------------------------------------------------------------------------
    async def fetch(self, msg: FetchKV, d: Delivery) -> None:
        svc, lay = self.svc, self.svc.layout
        subject = svc.subjects.prefill_loaded(svc.cfg.engine)
        owner = f"{msg.req_id}/fetch"
        with tracer.start_as_current_span("kv_fetch", context=d.ctx, attributes={
                "req_id": msg.req_id, "blocks": len(msg.keys), "node": msg.node, "path": "pe"}) as span:
            try:
                slots = svc.slots.allocate(owner, len(msg.keys))
            except OutOfSlots as exc:
                await svc.bus.publish(subject, LayerLoaded(msg.req_id, 0, -1, error=f"PE buffer full: {exc}"))
                return
            try:
                t0 = time.perf_counter()
                offsets = [s * lay.block_nbytes for s in slots]
                try:
                    done = await svc.bus.request(
                        svc.subjects.sg(msg.node, "read"),
                        ReadBlocks(msg.req_id, msg.layout, msg.keys, svc.buffer.name, offsets), ReadDone,
                        timeout=svc.cfg.transfer_timeout_s)
                except BusError as exc:
                    done = ReadDone(error=exc.reason)
                n = done.blocks
                self.m_layer_wait.labels("read").observe(time.perf_counter() - t0)
                span.set_attributes({"blocks_ok": n, "bytes": done.bytes, "read_s": done.seconds,
                                     "stop_reason": done.stop_reason or done.error})
                await svc.bus.publish(subject, LayerLoaded(msg.req_id, n, -1, error=done.error))
                if n:
                    await self._layers(msg, offsets[:n], msg.dst_blocks[:n], subject)
            finally:
                svc.slots.release(owner)
                svc.note_free()

    async def _layers(self, msg: FetchKV, offsets: list[int], blocks: list[int], subject: str) -> None:
        svc, lay = self.svc, self.svc.layout
        lb, bn = lay.layer_block_nbytes, lay.block_nbytes
        t0 = time.perf_counter()
        for layer in range(lay.n_layers):
            ops = [Op("buf", off + layer * lb, "kv", b * bn + layer * lb, lb) for off, b in zip(offsets, blocks)]
            await svc.endpoint.copy_local(ops, TrafficClass.LATENCY, timeout=svc.cfg.transfer_timeout_s)
            await svc.bus.publish(subject, LayerLoaded(msg.req_id, len(blocks), layer))
        svc.m_bytes.labels("h2d_layers").inc(bn * len(blocks))
        self.m_layer_wait.labels("h2d").observe(time.perf_counter() - t0)

    # save --------------------------------------------------------------------------------
    async def save(self, msg: SaveKV, d: Delivery) -> None:
        svc, lay = self.svc, self.svc.layout
        owner = f"{msg.req_id}/save/{msg.keys[0][:12] if msg.keys else ''}"
        n = min(len(msg.blocks), svc.slots.free)
        if n < len(msg.blocks):
            self.m_saved.labels("skipped_buffer_full").inc(len(msg.blocks) - n)
        if n == 0:
            await d.respond(SaveCopied(0))
            return
        slots = svc.slots.allocate(owner, n)
        offsets = [s * lay.block_nbytes for s in slots]
        bn = lay.block_nbytes
        ops = [Op("kv", b * bn, "buf", off, bn) for b, off in zip(msg.blocks[:n], offsets)]
        try:
            await svc.endpoint.copy_local(ops, TrafficClass.BULK, timeout=svc.cfg.transfer_timeout_s)
        except Exception as exc:  # noqa: BLE001 - persistence is best effort; never wrong data
            svc.slots.release(owner)
            await d.respond(SaveCopied(0, error=str(exc)))
            return
        await d.respond(SaveCopied(n))
        svc.spawn(self._write(msg, owner, offsets, d), name=f"save-{owner}")

    async def _write(self, msg: SaveKV, owner: str, offsets: list[int], d: Delivery) -> None:
        svc = self.svc
        try:
            with tracer.start_as_current_span("persist", context=d.ctx, attributes={
                    "req_id": msg.req_id, "blocks": len(offsets), "node": msg.node}):
                for key, off in zip(msg.keys, offsets):
                    try:
                        res = await svc.bus.request(svc.subjects.sg(msg.node, "write"),
                                                    WriteBlock(msg.layout, key, svc.buffer.name, off), WriteDone,
                                                    timeout=svc.cfg.transfer_timeout_s)
                        self.m_saved.labels(res.outcome or "error").inc()
                    except BusError as exc:
                        log.warning("persist %s failed: %s", key[:12], exc.reason)
                        self.m_saved.labels("error").inc()
        finally:
            svc.slots.release(owner)
            svc.note_free()
