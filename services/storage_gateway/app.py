"""Storage-gateway wiring: the node's storage NIC over NATS.

Owns every storage read and write of its node; one read and one write token bucket (the emulated
SNIC) for the whole node."""
from __future__ import annotations

import contextlib
import logging
import os
import time

from opentelemetry import trace

from services.storage_gateway.bucket import TokenBucket
from services.storage_gateway.bulk import BulkLane
from services.storage_gateway.config import StorageGatewayConfig
from services.storage_gateway.engine import GatewayCore
from services.storage_gateway.store import DirectoryStore
from shared.bus import Delivery
from shared.engine.store_layout import kv_layout
from shared.kv.hashing import FINGERPRINT_BYTES, check_key
from shared.messages.endpoints import EP
from shared.messages.registry import StorageGatewayAnnounce
from shared.messages.storage_gateway import (HitQuery, HitReply, LayersRead, ReadBlocks, ReadDone, Retain, StoreLayout,
                                             WriteBlock, WriteDone)
from shared.runtime import Service, service_main
from shared.transport.shm_region import ShmRegion

log = logging.getLogger("storage_gateway")
tracer = trace.get_tracer("storage_gateway")


class StorageGatewayService(Service):
    name = "storage_gateway"

    def __init__(self, cfg: StorageGatewayConfig):
        super().__init__(cfg)
        os.makedirs(cfg.store_root, exist_ok=True)
        self.read_bucket = TokenBucket.from_gbps(cfg.snic_read_gbps)
        self.write_bucket = TokenBucket.from_gbps(cfg.snic_write_gbps)
        self.cores: dict[StoreLayout, GatewayCore] = {}  # one per layout (fingerprint and block layout)
        self.buffers: dict[str, ShmRegion] = {}  # attached TM buffers by shm name
        self.lane = BulkLane()  # prefetch reads wait for the latency reads of the node (bulk.py)
        self.marks: dict[StoreLayout, int] = {}  # retention marks held per store (agents' hints)
        m = self.metrics
        self.m_read = m.counter("read_bytes_total", "Bytes read from the store", ("node",))
        self.m_bulk = m.counter("bulk_read_bytes_total", "Bytes read in the bulk lane (prefetches; also in read_bytes)",
                                ("node",))
        self.m_write = m.counter("write_bytes_total", "Bytes written to the store", ("node",))
        self.m_blocks = m.counter("blocks_total", "Blocks by outcome", ("outcome",))
        self.m_read_s = m.histogram("read_seconds", "Read request time (incl. queueing)")
        self.m_marks = m.gauge("retention_marks", "Blocks agents' hints retain or demote (expired ones until swept)")
        self.m_queue = m.gauge("read_queue_bytes", "Pending read bytes (read_q)", ("node",))

    async def start(self) -> None:
        s, node = self.subjects, self.cfg.node
        await self.bus.subscribe(s.at(EP.SG_READ, node=node), self._on_read)
        await self.bus.subscribe(s.at(EP.SG_WRITE, node=node), self._on_write)
        await self.bus.subscribe(s.at(EP.SG_HIT), self._on_hit, queue="hit")
        await self.bus.subscribe(s.at(EP.SG_RETAIN), self._on_retain)  # every gateway: its own index

    def announce(self) -> StorageGatewayAnnounce:
        blocks, nbytes = self.read_queue()
        return StorageGatewayAnnounce(instance=self.instance, node=self.cfg.node, metrics_url=self.metrics_url,
                               pid=os.getpid(), store_root=self.cfg.store_root, read_q_blocks=blocks,
                               read_q_bytes=nbytes, read_bytes_per_s=self.read_bucket.rate or 0.0)

    def read_queue(self) -> tuple[int, int]:
        snaps = [c.queue_snapshot() for c in self.cores.values()]
        return sum(s.pending_blocks for s in snaps), sum(s.pending_bytes for s in snaps)

    async def stop(self) -> None:
        for core in self.cores.values():
            core.close()
        for region in self.buffers.values():
            region.close()

    # helpers ------------------------------------------------------------------------
    def core(self, layout: StoreLayout) -> GatewayCore:
        core = self.cores.get(layout)  # by the whole layout: one fingerprint, one layout, one core
        if core is None:
            if len(layout.fingerprint) != FINGERPRINT_BYTES:
                raise ValueError(f"store fingerprint must be {FINGERPRINT_BYTES} bytes, got {len(layout.fingerprint)}")
            kv = kv_layout(layout)
            cap = int(self.cfg.capacity_gb * 1e9) or None
            store = DirectoryStore(self.cfg.store_root, layout.fingerprint, kv, cap)
            core = self.cores[layout] = GatewayCore(store, self.read_bucket, self.write_bucket, self.cfg.io_threads,
                                                    inline_bytes=int(self.cfg.inline_read_mib * 2**20))
        return core

    def buffer(self, shm: str) -> memoryview:
        region = self.buffers.get(shm)
        if region is None:
            region = self.buffers[shm] = ShmRegion.attach(shm)
        return region.buf

    # handlers -------------------------------------------------------------------------
    async def _on_hit(self, q: HitQuery, d: Delivery) -> None:
        try:
            n = await self.core(q.layout).hit_length_async([check_key(k) for k in q.block_keys])
        except Exception as exc:  # noqa: BLE001 - a bad query is answered, not fatal
            await d.respond(HitReply(error=str(exc)))
            return
        await d.respond(HitReply(blocks=n))

    async def _on_read(self, msg: ReadBlocks, d: Delivery) -> None:
        self.spawn(self._read(msg, d), name=f"read-{msg.req_id}",
                   on_error=lambda exc: d.respond(ReadDone(error=f"{type(exc).__name__}: {exc}")))

    async def _read(self, msg: ReadBlocks, d: Delivery) -> None:
        t0 = time.perf_counter()
        with tracer.start_as_current_span("storage_read", context=d.ctx, attributes={
                "req_id": msg.req_id, "node": self.cfg.node, "blocks": len(msg.block_keys), "bulk": msg.bulk}) as span:
            try:
                core = self.core(msg.layout)
                if msg.bulk and not await self.lane.wait_turn(msg.start_within_s):
                    await d.respond(ReadDone(stop_reason="bulk lane busy"))  # nothing was written
                    return
                self.m_queue.labels(self.cfg.node).set(self.read_queue()[1])
                with contextlib.nullcontext() if msg.bulk else self.lane.latency_read():
                    res = await core.read_blocks([check_key(k) for k in msg.block_keys], self.buffer(msg.shm),
                                                 msg.offsets, msg.group_layers,
                                                 self._reporter(msg) if msg.progress else None)
            except Exception as exc:  # noqa: BLE001
                span.record_exception(exc)
                await d.respond(ReadDone(error=str(exc)))
                return
            dt = time.perf_counter() - t0
            span.set_attributes({"bytes": res.bytes, "blocks_ok": res.blocks, "stop_reason": res.stop_reason or ""})
        self.m_read.labels(self.cfg.node).inc(res.bytes)
        if msg.bulk:
            self.m_bulk.labels(self.cfg.node).inc(res.bytes)
        self.m_blocks.labels("read").inc(res.blocks)
        if res.stop_reason:
            self.m_blocks.labels("miss_" + res.stop_reason.split(":")[0][:20]).inc()
        self.m_read_s.observe(dt)
        self.m_queue.labels(self.cfg.node).set(self.read_queue()[1])
        await d.respond(ReadDone(blocks=res.blocks, bytes=res.bytes, seconds=dt, stop_reason=res.stop_reason or ""))

    def _reporter(self, msg: ReadBlocks):
        """Where a read in layer groups reports each group as it lands (the fetching TM)."""
        async def report(layers: int, blocks: int, eta_s: float) -> None:
            self.m_queue.labels(self.cfg.node).set(self.read_queue()[1])
            await self.bus.publish(msg.progress, LayersRead(msg.req_id, msg.tag, layers, blocks, round(eta_s, 4)))
        return report

    async def _on_retain(self, msg: Retain, d: Delivery) -> None:
        if msg.release:
            for layout, core in self.cores.items():
                self.marks[layout] = self.marks.get(layout, 0) - core.store.release(msg.session)
        else:
            try:
                keys = [check_key(k) for k in msg.block_keys]
                self.marks[msg.layout] = self.core(msg.layout).store.retain(keys, msg.level, msg.ttl_s, msg.session)
            except ValueError as exc:  # a bad key or layout: dropped, never fatal
                log.warning("retention hint dropped: %s", exc)
        self.m_marks.set(sum(self.marks.values()))

    async def _on_write(self, msg: WriteBlock, d: Delivery) -> None:
        self.spawn(self._write(msg, d), name=f"write-{msg.block_key.hex()[:8]}",
                   on_error=lambda exc: d.respond(WriteDone(error=f"{type(exc).__name__}: {exc}")))

    async def _write(self, msg: WriteBlock, d: Delivery) -> None:
        with tracer.start_as_current_span("storage_write", context=d.ctx, attributes={"key": msg.block_key.hex()}):
            try:
                core = self.core(msg.layout)
                size = core.store.layout.payload_bytes
                view = self.buffer(msg.shm)[msg.offset:msg.offset + size]
                outcome = await core.write_block(check_key(msg.block_key), view)
            except Exception as exc:  # noqa: BLE001
                await d.respond(WriteDone(error=str(exc)))
                return
        name = outcome.name.lower()
        if name == "written":
            self.m_write.labels(self.cfg.node).inc(size)
        self.m_blocks.labels(name).inc()
        await d.respond(WriteDone(outcome=name))


def main(argv: list[str] | None = None) -> int:
    return service_main("storage_gateway", StorageGatewayConfig, StorageGatewayService, argv)
