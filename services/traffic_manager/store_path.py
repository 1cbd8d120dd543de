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

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from opentelemetry import trace

from shared.bus import BusError, Delivery
from shared.kv.allocator import OutOfSlots
from shared.messages.storage import ReadBlocks, ReadDone, StoreLayout, WriteBlock, WriteDone
from shared.messages.tm import FetchKV, LayerLoaded, Reserve, Reserved, SaveCopied, SaveKV, Stage, Staged
from shared.transport.base import Op, TrafficClass

if TYPE_CHECKING:
    from services.traffic_manager.app import TrafficManagerService

log = logging.getLogger("tm.store")
# Layers copied within this long of the last `LayerLoaded` are announced together (the
# message names the highest layer in place): a small model's layers copy in microseconds,
# and one message per layer would cost more CPU than the copies. A layer that takes
# longer than this is still announced the moment it lands.
LAYER_NOTIFY_GAP_S = 0.001
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
        """Load a request's hit blocks: keys[:k] on the PE path, keys[k:] on the DE path."""
        svc = self.svc
        subject = svc.subjects.prefill_loaded(svc.cfg.engine)
        n = len(msg.keys)
        k = n if msg.pe_blocks < 0 else min(msg.pe_blocks, n)
        owner = f"{msg.req_id}/fetch"
        with tracer.start_as_current_span("kv_fetch", context=d.ctx, attributes={
                "req_id": msg.req_id, "blocks": n, "pe_path_blocks": k, "de_path_blocks": n - k,
                "pe_node": msg.node, "de_node": msg.de_node}) as span:
            try:
                t0 = time.perf_counter()
                await self._announce_queue(msg, k, subject)
                (pe_ok, offsets, pe_err), staged = await self._both_paths(msg, k, owner)
                self.m_layer_wait.labels("read").observe(time.perf_counter() - t0)
                de_ok = staged.blocks if staged else 0
                hits = pe_ok if pe_ok < k else k + de_ok
                de_hits = list(range(k, hits))
                span.set_attributes({"blocks_ok": hits, "pe_ok": pe_ok, "de_ok": de_ok,
                                     "error": pe_err or (staged.error if staged else "")})
                await svc.bus.publish(subject, LayerLoaded(
                    msg.req_id, hits, -1, error=pe_err, de_slots=staged.slots if staged else [], de_hits=de_hits))
                if hits:
                    local = [(off, b) for off, b in zip(offsets[:min(pe_ok, hits)], msg.dst_blocks)]
                    remote = [(staged.slots[i], msg.dst_blocks[i]) for i in de_hits]
                    await self._layers(msg, local, remote, subject)
            finally:
                svc.slots.release(owner)
                svc.note_free()

    def _queue_wait(self, node: str, blocks: int) -> float:
        """1.5x the wait of a read of `blocks` queued at `node` now (announcements lag a heartbeat)."""
        return 1.5 * self.svc.read_wait(node, blocks * self.svc.layout.block_nbytes)

    def _deadline(self, node: str, blocks: int) -> float:
        """A storage read's deadline: the transfer deadline after the queue ahead of it drains."""
        return self.svc.cfg.transfer_timeout_s + self._queue_wait(node, blocks)

    async def _announce_queue(self, msg: FetchKV, k: int, subject: str) -> None:
        """Tell the engine when its read waits behind a storage queue long enough to matter for
        its fetch deadline (layer -2): deep queues are what a storage-bound node looks like."""
        n = len(msg.keys)
        wait = max(self._queue_wait(msg.node, k), self._queue_wait(msg.de_node, n - k) if k < n else 0.0)
        if wait > 0.25 * self.svc.cfg.transfer_timeout_s:
            await self.svc.bus.publish(subject, LayerLoaded(msg.req_id, 0, -2, eta_s=round(wait, 3)))

    async def _read_local(self, msg: FetchKV, keys: list[str], owner: str) -> tuple[int, list[int], str]:
        """PE path: this node's gateway reads `keys` into this TM's buffer."""
        svc = self.svc
        if not keys:
            return 0, [], ""
        try:
            slots = await svc.allocate_wait(owner, len(keys))
        except OutOfSlots as exc:
            return 0, [], f"PE buffer full: {exc}"
        offsets = [s * svc.layout.block_nbytes for s in slots]
        try:
            deadline = self._deadline(msg.node, len(keys))
            with svc.read_at(msg.node, len(keys) * svc.layout.block_nbytes):
                done = await svc.bus.request(svc.subjects.sg(msg.node, "read"),
                                             ReadBlocks(msg.req_id, msg.layout, keys, svc.buffer.name, offsets),
                                             ReadDone, timeout=deadline)
        except BusError as exc:
            return 0, offsets, exc.reason
        return done.blocks, offsets, done.error

    async def _reserve_remote(self, msg: FetchKV) -> Reserved:
        """A split read first holds the prompt's DE-buffer slots, and only then takes PE-buffer
        slots: one order for the two buffers, so no two fetches each hold one and wait for the
        other (with both buffers full that hold-and-wait stalled every split until its deadline)."""
        svc = self.svc
        try:
            return await svc.bus.request(svc.subjects.tm(msg.de_engine, "reserve"),
                                         Reserve(msg.req_id, msg.prompt_blocks), Reserved,
                                         timeout=svc.cfg.transfer_timeout_s)
        except BusError as exc:
            return Reserved(ok=False, error=exc.reason)

    async def _stage_remote(self, msg: FetchKV, k: int, slots: list[int] | None = None) -> Staged:
        """DE path: the DE's TM reserves the prompt's slots (unless given) and its gateway reads
        keys[k:] into them."""
        svc = self.svc
        try:
            deadline = self._deadline(msg.de_node, len(msg.keys) - k)
            with svc.read_at(msg.de_node, (len(msg.keys) - k) * svc.layout.block_nbytes):
                return await svc.bus.request(
                    svc.subjects.tm(msg.de_engine, "stage"),
                    Stage(msg.req_id, msg.prompt_blocks, k, msg.keys[k:], msg.de_node, msg.layout, slots=slots or []),
                    Staged, timeout=deadline)
        except BusError as exc:
            return Staged(error=exc.reason)

    async def _both_paths(self, msg: FetchKV, k: int, owner: str):
        """Read keys[:k] on the PE path and keys[k:] on the DE path at the same time."""
        n = len(msg.keys)
        if k == n:
            return await self._read_local(msg, msg.keys, owner), None
        if k == 0:
            return (0, [], ""), await self._stage_remote(msg, 0)
        res = await self._reserve_remote(msg)
        if not res.ok:  # no DE-buffer room: the PE path alone; the rest is computed
            return await self._read_local(msg, msg.keys[:k], owner), Staged(error=res.error)
        return await asyncio.gather(self._read_local(msg, msg.keys[:k], owner),
                                    self._stage_remote(msg, k, res.slots))

    async def _layers(self, msg: FetchKV, local: list[tuple[int, int]], remote: list[tuple[int, int]],
                      subject: str) -> None:
        """Layer after layer: PE-buffer blocks by local copy, DE-buffer blocks by a one-sided read."""
        svc, lay = self.svc, self.svc.layout
        lb, bn = lay.layer_block_nbytes, lay.block_nbytes
        peer = await svc._peer(msg.de_engine) if remote else None
        t0 = last = time.perf_counter()
        for layer in range(lay.n_layers):
            loc = [Op("buf", off + layer * lb, "kv", b * bn + layer * lb, lb) for off, b in local]
            rem = [Op("kv", b * bn + layer * lb, "buf", off + layer * lb, lb) for off, b in remote]
            await asyncio.gather(
                svc.endpoint.copy_local(loc, TrafficClass.LATENCY, timeout=svc.cfg.transfer_timeout_s) if loc
                else _none(),
                peer.read(rem, TrafficClass.LATENCY, timeout=svc.cfg.transfer_timeout_s) if rem else _none())
            now = time.perf_counter()
            if layer == lay.n_layers - 1 or now - last >= LAYER_NOTIFY_GAP_S:
                await svc.bus.publish(subject, LayerLoaded(msg.req_id, len(local) + len(remote), layer))
                last = now
        svc.m_bytes.labels("h2d_layers").inc(bn * len(local))
        svc.m_bytes.labels("de_path_pull").inc(bn * len(remote))
        self.m_layer_wait.labels("h2d").observe(time.perf_counter() - t0)

    # stage (DE side of the DE read path) ----------------------------------------------------
    async def stage(self, msg: Stage, d: Delivery) -> None:
        svc = self.svc
        bn = svc.layout.block_nbytes
        with tracer.start_as_current_span("kv_stage", context=d.ctx, attributes={
                "req_id": msg.req_id, "blocks": len(msg.keys), "node": msg.node, "path": "de"}) as span:
            if msg.slots and not set(msg.slots) <= {s * bn for s in svc.slots.held(msg.req_id)}:
                # released (cancelled) since they were reserved: they may be someone else's now
                await d.respond(Staged(error="reserved slots were released"))
                return
            try:
                slots = msg.slots or [s * bn for s in await svc.allocate_wait(msg.req_id, msg.prompt_blocks)]
            except OutOfSlots as exc:
                await d.respond(Staged(error=f"DE buffer full: {exc}"))
                return
            svc.busy.add(msg.req_id)
            try:
                offsets = slots[msg.first:msg.first + len(msg.keys)]
                deadline = self._deadline(msg.node, len(msg.keys))
                with svc.read_at(msg.node, len(msg.keys) * bn):
                    done = await svc.bus.request(svc.subjects.sg(msg.node, "read"),
                                                 ReadBlocks(msg.req_id, msg.layout, msg.keys, svc.buffer.name, offsets),
                                                 ReadDone, timeout=deadline)
            except BusError as exc:
                done = ReadDone(error=exc.reason)
            finally:
                svc.unbusy(msg.req_id)
            span.set_attributes({"blocks_ok": done.blocks, "bytes": done.bytes})
            if svc.cfg.fault_flip_de_bytes and done.blocks:
                flip_layer_signs(svc.buffer.buf, slots[msg.first], msg.layout)
                span.set_attribute("fault_injected", "flip_de_bytes")
            svc.note_free()
            await d.respond(Staged(slots=slots, blocks=done.blocks, error=done.error))

    # save --------------------------------------------------------------------------------
    async def save(self, msg: SaveKV, d: Delivery) -> None:
        svc, lay = self.svc, self.svc.layout
        owner = f"{msg.req_id}/save/{msg.keys[0][:12] if msg.keys else ''}"
        n = min(len(msg.blocks), svc.spare_slots())
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


async def _none():
    return None


def flip_layer_signs(buf: memoryview, offset: int, layout: StoreLayout) -> None:
    """Fault injection (tests only, `fault_flip_de_bytes`): negate every K/V value of the middle
    layer of the block at `offset` of `buf` -- bytes that passed the store's checksum, now wrong."""
    import numpy as np

    from shared.kv.layout import KVLayout

    kv = KVLayout(layout.n_layers, layout.n_kv_heads, layout.head_dim, layout.dtype, layout.block_size)
    itemsize, lb = kv.itemsize, kv.layer_bytes
    start = offset + (layout.n_layers // 2) * lb
    view = np.frombuffer(buf, dtype=np.uint8, count=lb, offset=start)
    view[itemsize - 1::itemsize] ^= 0x80  # little-endian: the sign bit sits in each value's last byte
