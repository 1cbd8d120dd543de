"""The traffic-manager's storage paths besides fetch (`fetch.py`): stage and save.

A request's slots are never freed while a gateway read or write still targets them."""
from __future__ import annotations

import logging
import time

from opentelemetry import trace

from services.traffic_manager.parts import TMParts
from services.traffic_manager.saves import SaveLine
from services.traffic_manager.transfers import TransferKind, Transfer
from services.traffic_manager.transfers import TransferState as T
from shared.bus import BusError, Delivery
from shared.kv.allocator import OutOfSlots
from shared.messages.endpoints import EP
from shared.messages.storage_gateway import ReadBlocks, ReadDone, StoreLayout, WriteBlock
from shared.messages.traffic_manager import SaveCopied, SaveKV, Stage, Staged
from shared.transport.base import Op, TrafficClass

log = logging.getLogger("traffic_manager.store")
tracer = trace.get_tracer("traffic_manager")


class StorePath:
    def __init__(self, parts: TMParts, pending=None):
        self.p, self.pending = parts, pending  # pending: PendingSaves (None: saved blocks are not kept)
        self.m_saved = parts.metrics.counter("saved_blocks_total", "Blocks handed to the gateway for persistence",
                                             ("outcome",))
        wait_s = min(parts.cfg.save_wait_s, parts.cfg.transfer_timeout_s / 2)  # inside the engines' save deadline
        self.line = SaveLine(parts.pool, parts.cfg.save_queue_blocks, wait_s,
                             parts.metrics.gauge("save_queue_blocks", "Blocks of saves waiting for buffer room"),
                             self.m_saved)

    # stage (DE side of the DE read path) ----------------------------------------------------
    async def stage(self, msg: Stage, d: Delivery) -> None:
        p, pool = self.p, self.p.pool
        bn = pool.block_nbytes
        with tracer.start_as_current_span("kv_stage", context=d.ctx, attributes={
                "req_id": msg.req_id, "blocks": len(msg.block_keys), "node": msg.node, "path": "de"}) as span, \
                p.xfers.begin(TransferKind.STAGE, msg.req_id, T.RESERVING) as t:
            if msg.slots and not set(msg.slots) <= {s * bn for s in pool.slots.held(msg.req_id)}:
                # released (cancelled) since they were reserved: they may be someone else's now
                t.error = T.RELEASED
                await d.respond(Staged(error="reserved slots were released"))
                return
            try:
                slots = msg.slots or [s * bn for s in await pool.allocate_wait(msg.req_id, msg.prompt_blocks)]
            except OutOfSlots as exc:
                t.error = exc
                await d.respond(Staged(error=f"DE buffer full: {exc}"))
                return
            p.xfers.move(t, T.READING)
            with pool.reading(msg.req_id):
                try:
                    offsets = slots[msg.first:msg.first + len(msg.block_keys)]
                    nbytes = len(msg.block_keys) * bn
                    streamed = msg.progress and not p.cfg.fault_flip_de_bytes  # a fault goes in after the checksum
                    with p.queues.read_at(msg.node, nbytes):
                        done = await p.bus.request(
                            p.subjects.at(EP.SG_READ, node=msg.node),
                            ReadBlocks(msg.req_id, msg.layout, msg.block_keys, pool.buffer.name, offsets,
                                       group_layers=msg.group_layers if streamed else 0,
                                       progress=msg.progress if streamed else "", tag="de"),
                            timeout=p.queues.deadline(msg.node, nbytes))
                except BusError as exc:
                    t.error = exc  # answered as a read of no blocks
                    done = ReadDone(error=exc.reason)
                if p.cfg.fault_flip_de_bytes and done.blocks:  # while the slots are still this request's
                    flip_layer_signs(pool.buffer.buf, slots[msg.first], msg.layout)
                    span.set_attribute("fault_injected", "flip_de_bytes")
            span.set_attributes({"blocks_ok": done.blocks, "bytes": done.bytes})
            pool.note_free()
            grant = p.given.give(msg.req_id, slots, bn) if msg.req_id not in pool.cancelled else b""
            await d.respond(Staged(slots=slots, blocks=done.blocks, error=done.error, grant=grant))

    # save --------------------------------------------------------------------------------
    async def save(self, msg: SaveKV, d: Delivery) -> None:
        """A save's transfer: QUEUED for room, COPYING out of KV memory, WRITING to the store."""
        t = self.p.xfers.begin(TransferKind.SAVE, msg.req_id, T.WRITING if msg.slots else T.QUEUED)
        try:
            await (self._save_slots(msg, d, t) if msg.slots else self._save_blocks(msg, d, t))
        except BaseException as exc:
            self.p.xfers.end(t, exc)
            raise

    async def _save_blocks(self, msg: SaveKV, d: Delivery, t: Transfer) -> None:
        p, pool = self.p, self.p.pool
        owner = f"{msg.req_id}/save/{msg.block_keys[0].hex()[:12] if msg.block_keys else ''}"
        n = len(msg.blocks)
        t0 = time.monotonic()
        offsets = None if n == 0 else await self.line.take(owner, n)
        if offsets is None:  # nothing to save, or dropped: the line full, or no room within its wait
            p.xfers.end(t, T.DONE if n == 0 else T.EXPIRED if time.monotonic() - t0 >= self.line.wait_s else T.FAILED)
            await d.respond(SaveCopied(0, error="" if n == 0 else "save dropped: no buffer room in time"))
            return
        p.xfers.move(t, T.COPYING)
        bn = pool.block_nbytes
        offsets = [s * bn for s in offsets]
        ops = [Op("kv", b * bn, "buf", off, bn) for b, off in zip(msg.blocks, offsets)]
        try:
            await p.endpoint.copy_local(ops, TrafficClass.BULK, timeout=p.cfg.transfer_timeout_s)
        except Exception as exc:  # noqa: BLE001 - persistence is best effort; never wrong data
            p.xfers.end(t, exc)
            pool.release(owner)
            self.m_saved.labels("error").inc(n)
            await d.respond(SaveCopied(0, error=str(exc)))
            return
        p.xfers.move(t, T.WRITING)
        await d.respond(SaveCopied(n))
        slot_ids = [off // bn for off in offsets]
        pool.pin(slot_ids)
        if self.pending is not None:
            self.pending.keep_generated(msg, owner)

        def done() -> None:
            pool.unpin(slot_ids)
            pool.release(owner)
        p.spawn(self._write(msg, offsets, d, done, t), name=f"save-{owner}", label="persist")

    async def _save_slots(self, msg: SaveKV, d: Delivery, t: Transfer) -> None:
        """The blocks sit in this buffer already: write them from there, the slots held until then."""
        pool = self.p.pool
        bn = pool.block_nbytes
        if not set(msg.slots) <= {s * bn for s in pool.slots.held(msg.req_id)}:
            self.p.xfers.end(t, T.RELEASED)
            self.m_saved.labels("error").inc(len(msg.slots))
            await d.respond(SaveCopied(0, error="slots were released before the save"))
            return
        pool.begin_io(msg.req_id)  # before any await: a release from here on frees them after the write
        slot_ids = [off // bn for off in msg.slots]
        pool.pin(slot_ids)  # whoever holds them later (kept for the next turn: pending.py)
        if self.pending is not None:
            self.pending.keep_prompt(msg)
        await d.respond(SaveCopied(len(msg.slots)))

        def done() -> None:
            pool.unpin(slot_ids)
            pool.end_io(msg.req_id)
        self.p.spawn(self._write(msg, list(msg.slots), d, done, t), name=f"save-{msg.req_id}", label="persist")

    async def _write(self, msg: SaveKV, offsets: list[int], d: Delivery, done, t: Transfer) -> None:
        """Buffer to store, a block at a time; then `done` frees the slots (a failed write is only logged)."""
        p = self.p
        try:
            with tracer.start_as_current_span("persist", context=d.ctx, attributes={
                    "req_id": msg.req_id, "blocks": len(offsets), "node": msg.node}):
                for key, off in zip(msg.block_keys, offsets):
                    try:
                        res = await p.bus.request(p.subjects.at(EP.SG_WRITE, node=msg.node),
                                                  WriteBlock(msg.layout, key, p.pool.buffer.name, off),
                                                  timeout=p.cfg.transfer_timeout_s)
                        self.m_saved.labels(res.outcome or "error").inc()
                    except BusError as exc:
                        t.error = exc
                        log.warning("persist %s failed: %s", key.hex()[:12], exc.reason)
                        self.m_saved.labels("error").inc()
        except BaseException as exc:
            t.error = exc
            raise
        finally:
            done()
            p.xfers.end(t, t.error)


def flip_layer_signs(buf: memoryview, offset: int, layout: StoreLayout) -> None:
    """Fault injection (tests only): negate every value of the middle layer of the block at `offset`."""
    import numpy as np

    from shared.engine.store_layout import kv_layout

    kv = kv_layout(layout)
    itemsize, lb = kv.itemsize, kv.layer_bytes
    start = offset + (layout.n_layers // 2) * lb
    view = np.frombuffer(buf, dtype=np.uint8, count=lb, offset=start)
    view[itemsize - 1::itemsize] ^= 0x80  # little-endian: the sign bit sits in each value's last byte
