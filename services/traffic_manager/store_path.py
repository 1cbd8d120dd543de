"""The traffic-manager's storage paths besides fetch (`fetch.py`): stage and save.

Stage (DE side of the DE read path): reserve buffer slots for a whole prompt (unless the
fetching TM reserved them already) and have this node's gateway read hit blocks into some
of them; the PE's traffic-manager then reads them one-sidedly, layer by layer.
Save: KV memory -> buffer slots (bulk class) -> `SaveCopied` to the engine (its blocks
may be reused from then on) -> gateway writes each block in the background.
A request's slots are never freed while a gateway read or write still targets them.
"""
from __future__ import annotations

import logging

from opentelemetry import trace

from services.traffic_manager.parts import TMParts
from shared.bus import BusError, Delivery
from shared.kv.allocator import OutOfSlots
from shared.messages.storage_gateway import ReadBlocks, ReadDone, StoreLayout, WriteBlock, WriteDone
from shared.messages.traffic_manager import SaveCopied, SaveKV, Stage, Staged
from shared.transport.base import Op, TrafficClass

log = logging.getLogger("traffic_manager.store")
tracer = trace.get_tracer("traffic_manager")


class StorePath:
    def __init__(self, parts: TMParts):
        self.p = parts
        self.m_saved = parts.metrics.counter("saved_blocks_total", "Blocks handed to the gateway for persistence",
                                             ("outcome",))

    # stage (DE side of the DE read path) ----------------------------------------------------
    async def stage(self, msg: Stage, d: Delivery) -> None:
        p, pool = self.p, self.p.pool
        bn = pool.block_nbytes
        with tracer.start_as_current_span("kv_stage", context=d.ctx, attributes={
                "req_id": msg.req_id, "blocks": len(msg.keys), "node": msg.node, "path": "de"}) as span:
            if msg.slots and not set(msg.slots) <= {s * bn for s in pool.slots.held(msg.req_id)}:
                # released (cancelled) since they were reserved: they may be someone else's now
                await d.respond(Staged(error="reserved slots were released"))
                return
            try:
                slots = msg.slots or [s * bn for s in await pool.allocate_wait(msg.req_id, msg.prompt_blocks)]
            except OutOfSlots as exc:
                await d.respond(Staged(error=f"DE buffer full: {exc}"))
                return
            with pool.reading(msg.req_id):
                try:
                    offsets = slots[msg.first:msg.first + len(msg.keys)]
                    nbytes = len(msg.keys) * bn
                    with p.queues.read_at(msg.node, nbytes):
                        done = await p.bus.request(
                            p.subjects.sg(msg.node, "read"),
                            ReadBlocks(msg.req_id, msg.layout, msg.keys, pool.buffer.name, offsets), ReadDone,
                            timeout=p.queues.deadline(msg.node, nbytes))
                except BusError as exc:
                    done = ReadDone(error=exc.reason)
            span.set_attributes({"blocks_ok": done.blocks, "bytes": done.bytes})
            if p.cfg.fault_flip_de_bytes and done.blocks:
                flip_layer_signs(pool.buffer.buf, slots[msg.first], msg.layout)
                span.set_attribute("fault_injected", "flip_de_bytes")
            pool.note_free()
            grant = p.given.give(msg.req_id, slots, bn) if msg.req_id not in pool.cancelled else b""
            await d.respond(Staged(slots=slots, blocks=done.blocks, error=done.error, grant=grant))

    # save --------------------------------------------------------------------------------
    async def save(self, msg: SaveKV, d: Delivery) -> None:
        p, pool = self.p, self.p.pool
        owner = f"{msg.req_id}/save/{msg.keys[0].hex()[:12] if msg.keys else ''}"
        n = min(len(msg.blocks), pool.spare())
        if n < len(msg.blocks):
            self.m_saved.labels("skipped_buffer_full").inc(len(msg.blocks) - n)
        if n == 0:
            await d.respond(SaveCopied(0))
            return
        bn = pool.block_nbytes
        offsets = [s * bn for s in pool.slots.allocate(owner, n)]
        ops = [Op("kv", b * bn, "buf", off, bn) for b, off in zip(msg.blocks[:n], offsets)]
        try:
            await p.endpoint.copy_local(ops, TrafficClass.BULK, timeout=p.cfg.transfer_timeout_s)
        except Exception as exc:  # noqa: BLE001 - persistence is best effort; never wrong data
            pool.release(owner)
            await d.respond(SaveCopied(0, error=str(exc)))
            return
        await d.respond(SaveCopied(n))
        p.spawn(self._write(msg, owner, offsets, d), name=f"save-{owner}", label="persist")

    async def _write(self, msg: SaveKV, owner: str, offsets: list[int], d: Delivery) -> None:
        p = self.p
        try:
            with tracer.start_as_current_span("persist", context=d.ctx, attributes={
                    "req_id": msg.req_id, "blocks": len(offsets), "node": msg.node}):
                for key, off in zip(msg.keys, offsets):
                    try:
                        res = await p.bus.request(p.subjects.sg(msg.node, "write"),
                                                  WriteBlock(msg.layout, key, p.pool.buffer.name, off), WriteDone,
                                                  timeout=p.cfg.transfer_timeout_s)
                        self.m_saved.labels(res.outcome or "error").inc()
                    except BusError as exc:
                        log.warning("persist %s failed: %s", key.hex()[:12], exc.reason)
                        self.m_saved.labels("error").inc()
        finally:
            p.pool.release(owner)


def flip_layer_signs(buf: memoryview, offset: int, layout: StoreLayout) -> None:
    """Fault injection (tests only, `fault_flip_de_bytes`): negate every value (K/V or MLA latent) of
    the middle layer of the block at `offset` of `buf` -- bytes that passed the store's checksum, now wrong."""
    import numpy as np

    from shared.engine.store_layout import kv_layout

    kv = kv_layout(layout)
    itemsize, lb = kv.itemsize, kv.layer_bytes
    start = offset + (layout.n_layers // 2) * lb
    view = np.frombuffer(buf, dtype=np.uint8, count=lb, offset=start)
    view[itemsize - 1::itemsize] ^= 0x80  # little-endian: the sign bit sits in each value's last byte
