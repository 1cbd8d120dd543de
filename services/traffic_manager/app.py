"""Traffic-manager wiring: control over NATS, bytes over the data plane.

Owns the engine's DRAM buffer (slots of one KV block each), the data-plane endpoint
with regions "buf" (the buffer) and "kv" (the engine's KV memory, attached once the
engine announces it), and connections to other traffic-managers.

Push (PE side): PushKV -> Reserve at the DE's TM -> write blocks kv -> remote buf -> PushDone.
Reserve (DE side): allocate buffer slots for a request.
Load (DE side): copy buffer slots -> KV blocks (local H2D), free the slots.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time

import msgspec
from opentelemetry import trace

from services.traffic_manager.config import TrafficManagerConfig
from services.traffic_manager.store_path import StorePath
from services.traffic_manager.waitline import WaitLine
from shared.bus import BusError, Delivery
from shared.engine.requests import RecentSet
from shared.kv.allocator import OutOfSlots, SlotAllocator
from shared.messages.registry import Announce, EngineAnnounce, GatewayAnnounce, KVRegion, TrafficManagerAnnounce
from shared.messages.tm import FetchKV, LoadKV, PushDone, PushKV, Release, Reserve, Reserved, SaveKV, Stage
from shared.messages.work import Cancel
from shared.runtime import Service, service_main
from shared.transport.base import EndpointDesc, Op, Peer, TrafficClass
from shared.transport.shm_region import ShmRegion, new_name

log = logging.getLogger("tm")
tracer = trace.get_tracer("traffic-manager")
_desc_encoder = msgspec.msgpack.Encoder()
_desc_decoder = msgspec.msgpack.Decoder(EndpointDesc)


class TrafficManagerService(Service):
    name = "traffic-manager"

    def __init__(self, cfg: TrafficManagerConfig):
        super().__init__(cfg)
        self.buffer = ShmRegion.create(new_name("tm-buf"), cfg.buffer_mb << 20)
        self.endpoint = None
        self.layout: KVRegion | None = None
        self.kv_region: ShmRegion | None = None
        self.slots: SlotAllocator | None = None
        self.remote: dict[str, EndpointDesc] = {}  # engine -> its TM's endpoint
        self.peers: dict[str, Peer] = {}
        self.store_path = StorePath(self)
        self.cancelled = RecentSet()  # released/cancelled ids: a reservation arriving after them is dropped
        self.busy: set[str] = set()  # requests whose slots a storage read still targets
        self.free_later: set[str] = set()  # released while busy: freed when the read ends
        self.line: WaitLine | None = None  # who waits for buffer room (set with the slots)
        self.gateways: dict[str, GatewayAnnounce] = {}  # node -> its storage-gateway's last announcement
        self.reading: dict[str, int] = {}  # node -> bytes this TM asked that node's gateway for, not yet read
        m = self.metrics
        self.m_bytes = m.counter("tm_bytes_total", "Bytes moved on the data plane", ("kind",))
        self.m_xfer = m.histogram("tm_transfer_seconds", "Transfer time", ("kind",))
        self.m_free = m.gauge("tm_buffer_free_bytes", "Free DRAM buffer bytes")

    async def start(self) -> None:
        from shared.transport.registry import create_endpoint

        cfg = self.cfg
        self.endpoint = create_endpoint(cfg.transport, host=cfg.host, port=cfg.data_port, node=cfg.engine,
                                        weights=(cfg.latency_weight, cfg.bulk_weight))
        await self.endpoint.start()
        log.info("data plane: %s transport (%s)", self.endpoint.backend, self.endpoint.why)
        self.endpoint.register("buf", self.buffer.buf, shm_name=self.buffer.name)
        s, e = self.subjects, cfg.engine
        await self.bus.subscribe(s.heartbeat, Announce, self._on_announce)
        await self.bus.subscribe(s.tm(e, "push"), PushKV, self._on_push)
        await self.bus.subscribe(s.tm(e, "reserve"), Reserve, self._on_reserve)
        await self.bus.subscribe(s.tm(e, "load"), LoadKV, self._on_load)
        await self.bus.subscribe(s.tm(e, "release"), Release, self._on_release)
        await self.bus.subscribe(s.tm(e, "fetch"), FetchKV, self._on_fetch)
        await self.bus.subscribe(s.tm(e, "save"), SaveKV, self._on_save)
        await self.bus.subscribe(s.tm(e, "stage"), Stage, self._on_stage)
        await self.bus.subscribe(s.cancel, Cancel, self._on_release)

    def announce(self) -> TrafficManagerAnnounce:
        free = self.slots.free * self.layout.block_nbytes if self.slots else self.buffer.size
        return TrafficManagerAnnounce(
            instance=self.instance, node=self.cfg.node, metrics_url=self.metrics_url, pid=os.getpid(),
            engine=self.cfg.engine, endpoint=_desc_encoder.encode(self.endpoint.desc()) if self.endpoint else b"",
            buffer_bytes=self.buffer.size, buffer_free_bytes=free, ready=self.kv_region is not None)

    async def stop(self) -> None:
        for peer in self.peers.values():
            await peer.close()
        if self.endpoint:
            await self.endpoint.close()
        for region in (self.kv_region, self.buffer):
            if region is not None:
                try:
                    region.close()
                except BufferError:
                    pass
        self.buffer.unlink()

    # directory ------------------------------------------------------------------
    async def _on_announce(self, msg, d: Delivery) -> None:
        if isinstance(msg, GatewayAnnounce):
            self.gateways[msg.node] = msg
        elif isinstance(msg, EngineAnnounce) and msg.engine == self.cfg.engine and msg.kv is not None:
            self._attach(msg.kv)
        elif isinstance(msg, TrafficManagerAnnounce) and msg.engine != self.cfg.engine and msg.endpoint:
            if msg.leaving:
                self.remote.pop(msg.engine, None)
                peer = self.peers.pop(msg.engine, None)
                if peer:
                    await peer.close()
                return
            desc = _desc_decoder.decode(msg.endpoint)
            self.remote[msg.engine] = desc
            if msg.engine in self.peers:
                self.peers[msg.engine].refresh(desc)

    def _attach(self, layout: KVRegion) -> None:
        if self.layout is not None and self.layout.shm_name == layout.shm_name:
            return
        if self.kv_region is not None:  # the engine restarted with new KV memory
            self.kv_region.close()
        self.kv_region = ShmRegion.attach(layout.shm_name)
        self.endpoint.register("kv", self.kv_region.buf, shm_name=layout.shm_name)
        self.layout = layout
        self.slots = SlotAllocator(max(1, self.buffer.size // layout.block_nbytes))
        self.line = WaitLine(self.slots)
        self.m_free.set(self.slots.free * layout.block_nbytes)
        log.info("attached KV memory %s (%d blocks)", layout.shm_name, layout.num_blocks)

    async def _peer(self, engine: str) -> Peer:
        peer = self.peers.get(engine)
        if peer is None:
            desc = self.remote.get(engine)
            if desc is None:
                raise BusError(engine, "no traffic-manager announced for that engine")
            peer = self.peers[engine] = await self.endpoint.connect(desc)
        return peer

    def read_wait(self, node: str, nbytes: int = 0) -> float:
        """Seconds a read of `nbytes` queued now at `node`'s gateway waits for its storage NIC
        (from the gateway's last announcement; 0 when uncapped or unknown). Storage deadlines
        add it: a read queued behind minutes of others is slow, not lost."""
        g = self.gateways.get(node)
        if g is None or g.read_bytes_per_s <= 0:
            return 0.0
        # the announcement may be a heartbeat old: this TM's own outstanding reads are known now
        return (max(g.read_q_bytes, self.reading.get(node, 0)) + nbytes) / g.read_bytes_per_s

    @contextlib.contextmanager
    def read_at(self, node: str, nbytes: int):
        """Count `nbytes` as outstanding at `node` for as long as the block runs."""
        self.reading[node] = self.reading.get(node, 0) + nbytes
        try:
            yield
        finally:
            self.reading[node] -= nbytes

    # push (PE side) ------------------------------------------------------------------
    async def _on_push(self, msg: PushKV, d: Delivery) -> None:
        self.spawn(self._push(msg, d), name=f"push-{msg.req_id}")

    async def _push(self, msg: PushKV, d: Delivery) -> None:
        bn = self.layout.block_nbytes if self.layout else 0
        nbytes = bn * len(msg.src_blocks)
        t0 = time.perf_counter()
        with tracer.start_as_current_span("kv_transfer", context=d.ctx, attributes={
                "req_id": msg.req_id, "dst_engine": msg.dst_engine, "blocks": len(msg.src_blocks),
                "bytes": nbytes, "transport": self.cfg.transport}) as span:
            try:
                if not self.layout:
                    raise BusError("push", "engine KV memory not attached yet")
                if msg.dst_slots:  # DE read path: slots were reserved when the hits were staged
                    res = Reserved(slots=msg.dst_slots)
                else:
                    res = await self.bus.request(self.subjects.tm(msg.dst_engine, "reserve"),
                                                 Reserve(msg.req_id, len(msg.src_blocks)), Reserved,
                                                 timeout=self.cfg.transfer_timeout_s)
                    if not res.ok:
                        raise BusError("reserve", res.error)
                skip = set(msg.skip)  # blocks whose stored KV is already in the DE buffer
                ops = [Op("kv", b * bn, "buf", slot, bn)
                       for i, (b, slot) in enumerate(zip(msg.src_blocks, res.slots)) if i not in skip]
                nbytes = bn * len(ops)
                span.set_attributes({"bytes": nbytes, "blocks_sent": len(ops), "blocks_skipped": len(skip)})
                if ops:
                    peer = await self._peer(msg.dst_engine)
                    await peer.write(ops, TrafficClass.LATENCY, timeout=self.cfg.transfer_timeout_s)
            except Exception as exc:  # noqa: BLE001 - BusError and transport errors both end the push
                span.record_exception(exc)
                await d.respond(PushDone(ok=False, error=str(exc)))
                return
            dt = time.perf_counter() - t0
            self.m_bytes.labels("pd_push").inc(nbytes)
            self.m_xfer.labels("pd_push").observe(dt)
            await d.respond(PushDone(slots=res.slots, nbytes=nbytes, seconds=dt))

    # reserve / load / release (DE side) --------------------------------------------------
    async def allocate_wait(self, owner: str, n: int) -> list[int]:
        """Buffer slots for `owner`, waiting in line (up to the transfer deadline) for room."""
        return await self.line.allocate(owner, n, self.cfg.transfer_timeout_s, lambda o: o in self.cancelled)

    def spare_slots(self) -> int:
        """Free slots nobody is waiting for (what best-effort persistence may take)."""
        return self.line.spare()

    async def _on_reserve(self, msg: Reserve, d: Delivery) -> None:
        if self.slots is None:
            await d.respond(Reserved(ok=False, error="engine KV memory not attached yet"))
            return
        self.spawn(self._reserve(msg, d), name=f"reserve-{msg.req_id}")

    async def _reserve(self, msg: Reserve, d: Delivery) -> None:
        with tracer.start_as_current_span("kv_reserve", context=d.ctx,
                                          attributes={"req_id": msg.req_id, "blocks": msg.n_blocks}):
            try:
                slots = await self.allocate_wait(msg.req_id, msg.n_blocks)
            except OutOfSlots as exc:
                await d.respond(Reserved(ok=False, error=f"DE buffer full: {exc}"))
                return
        bn = self.layout.block_nbytes
        self.m_free.set(self.slots.free * bn)
        await d.respond(Reserved(slots=[s * bn for s in slots]))

    async def _on_load(self, msg: LoadKV, d: Delivery) -> None:
        self.spawn(self._load(msg, d), name=f"load-{msg.req_id}")

    async def _load(self, msg: LoadKV, d: Delivery) -> None:
        bn = self.layout.block_nbytes
        nbytes = bn * len(msg.slots)
        t0 = time.perf_counter()
        with tracer.start_as_current_span("kv_h2d", context=d.ctx, attributes={
                "req_id": msg.req_id, "blocks": len(msg.slots), "bytes": nbytes}) as span:
            ops = [Op("buf", slot, "kv", b * bn, bn) for slot, b in zip(msg.slots, msg.dst_blocks)]
            try:
                await self.endpoint.copy_local(ops, TrafficClass.LATENCY, timeout=self.cfg.transfer_timeout_s)
            except Exception as exc:  # noqa: BLE001
                span.record_exception(exc)
                await d.respond(PushDone(ok=False, error=str(exc)))
                return
            finally:
                if msg.release:
                    self._free(msg.req_id)
        dt = time.perf_counter() - t0
        self.m_bytes.labels("h2d").inc(nbytes)
        self.m_xfer.labels("h2d").observe(dt)
        await d.respond(PushDone(nbytes=nbytes, seconds=dt))

    async def _on_release(self, msg, d: Delivery) -> None:
        self.cancelled.add(msg.req_id)
        self._free(msg.req_id)

    def _free(self, req_id: str) -> None:
        if req_id in self.busy:
            self.free_later.add(req_id)
            return
        if self.slots is not None and self.slots.release(req_id):
            self.note_free()

    def unbusy(self, req_id: str) -> None:
        self.busy.discard(req_id)
        if req_id in self.free_later:
            self.free_later.discard(req_id)
            self._free(req_id)

    def note_free(self) -> None:
        if self.line is not None:
            self.line.note_free()
        if self.slots is not None:
            self.m_free.set(self.slots.free * self.layout.block_nbytes)

    # storage paths (store_path.py) ---------------------------------------------------------
    async def _on_fetch(self, msg: FetchKV, d: Delivery) -> None:
        if self.slots is None:
            return
        self.spawn(self.store_path.fetch(msg, d), name=f"fetch-{msg.req_id}")

    async def _on_stage(self, msg: Stage, d: Delivery) -> None:
        if self.slots is None:
            from shared.messages.tm import Staged

            await d.respond(Staged(error="KV memory not attached"))
            return
        self.spawn(self.store_path.stage(msg, d), name=f"stage-{msg.req_id}")

    async def _on_save(self, msg: SaveKV, d: Delivery) -> None:
        if self.slots is None:
            from shared.messages.tm import SaveCopied

            await d.respond(SaveCopied(0, error="KV memory not attached"))
            return
        self.spawn(self.store_path.save(msg, d), name=f"save-{msg.req_id}")


def main(argv: list[str] | None = None) -> int:
    return service_main("traffic_manager", TrafficManagerConfig, TrafficManagerService, argv)
