"""Traffic-manager wiring: control over NATS, bytes over the data plane.

Owns the engine's DRAM buffer, the data-plane endpoint and the connections to other traffic
managers; the storage paths get their collaborators from parts.py. Every request is answered,
also when it fails, with the failure's `ErrorCode`."""
from __future__ import annotations

import asyncio
import logging
import os
import time

import msgspec
from opentelemetry import trace

from services.traffic_manager.config import TrafficManagerConfig
from services.traffic_manager.fetch import FetchPath
from services.traffic_manager.parts import NOT_ATTACHED, PeersGone, TMParts
from services.traffic_manager.pending import install as install_pending
from services.traffic_manager.lost_reserves import orphaned
from services.traffic_manager.pool import BufferPool
from services.traffic_manager.prefetch import PrefetchPath
from services.traffic_manager.progress import LayerState, ReadTrack, Registry
from services.traffic_manager.push import PushPath
from services.traffic_manager.read_queues import ReadQueues
from services.traffic_manager.secret import mesh_secret
from services.traffic_manager.slot_grants import GrantsGiven, GrantsHeld
from services.traffic_manager.store_path import StorePath
from services.traffic_manager.transfers import TransferKind, Transfers
from services.traffic_manager.transfers import TransferState as T
from shared.bus import BusError, Delivery
from shared.kv.allocator import OutOfSlots
from shared.kv.staged_table import StagedTable
from shared.messages.endpoints import EP
from shared.messages.registry import EngineAnnounce, StorageGatewayAnnounce, KVRegion, TrafficManagerAnnounce
from shared.messages.codes import ErrorCode
from shared.messages.storage_gateway import LayersRead
from shared.messages.traffic_manager import (FetchFailed, FetchKV, ForwardAlive, LayersComputed, LoadKV, PushDone,
                                             PushKV, Release, Reserve, Reserved, SaveCopied, SaveKV, Stage, Staged,
                                             TmAttached)
from shared.runtime import Service, service_main
from shared.transport.base import EndpointDesc, Op, Peer, TrafficClass, same_process, shm_host
from shared.transport.shm_region import ShmRegion, new_name

log = logging.getLogger("traffic_manager")
tracer = trace.get_tracer("traffic_manager")
_desc_encoder = msgspec.msgpack.Encoder()
_desc_decoder = msgspec.msgpack.Decoder(EndpointDesc)


def _why(exc: Exception) -> str:
    return exc.reason if isinstance(exc, BusError) else f"{type(exc).__name__}: {exc}"


class TrafficManagerService(Service):
    name = "traffic_manager"

    def __init__(self, cfg: TrafficManagerConfig):
        super().__init__(cfg)
        m = self.metrics
        self.m_bytes = m.counter("bytes_total", "Bytes moved on the data plane", ("kind",))
        self.m_xfer = m.histogram("transfer_seconds", "Transfer time", ("kind",))
        self.pool = BufferPool(ShmRegion.create(new_name("tm-buf"), cfg.buffer_mb << 20), cfg.transfer_timeout_s,
                               m.gauge("buffer_free_bytes", "Free DRAM buffer bytes"),
                               self._slots_freed)
        self.given: GrantsGiven | None = None  # set in start(), once the endpoint exists
        self.held = GrantsHeld()
        self.reserved_on: dict[str, asyncio.Future] = {}  # a reservation -> the NATS connection it came on
        self.queues = ReadQueues(cfg.transfer_timeout_s)
        self.endpoint = None
        self.kv_region: ShmRegion | None = None
        self.remote: dict[str, EndpointDesc] = {}  # engine -> its TM's endpoint
        self.peers: dict[str, Peer] = {}
        self.fetch_path: FetchPath | None = None  # set in start(), once the endpoint is up
        self.store_path: StorePath | None = None
        self.push_path: PushPath | None = None
        self.reads = Registry(ReadTrack)  # storage reads in layer groups, as their gateways report them
        self.layers = Registry(LayerState)  # layers computed by the engine and pushed on, per request
        self.prefetch: PrefetchPath | None = None
        self.xfers = Transfers()  # every transfer's state, by kind (transfers.py)
        self.xfers.expose(m)

    async def start(self) -> None:
        from shared.transport.registry import create_endpoint

        cfg = self.cfg
        secret = await mesh_secret(self.bus.nc, cfg.namespace, cfg.data_plane_secret)
        self.endpoint = create_endpoint(cfg.transport, host=cfg.host, port=cfg.data_port, node=cfg.engine,
                                        weights=(cfg.latency_weight, cfg.bulk_weight), secret=secret)
        await self.endpoint.start()
        log.info("data plane: %s transport (%s)", self.endpoint.backend, self.endpoint.why)
        self.endpoint.register("buf", self.pool.buffer.buf, shm_name=self.pool.buffer.name)  # reached via grants
        self.peers_gone = PeersGone()
        self.given = GrantsGiven(self.endpoint)
        parts = TMParts(cfg, self.bus, self.subjects, self.metrics, self.pool, self.endpoint, self.peer, self.queues,
                        self.m_bytes, self.spawn, self.given, self.held, self.reads, self.layers,
                        claim_local=lambda o, k: self.prefetch.claim(o, k),
                        drop_local=lambda o, why: self.prefetch.drop(o, why), xfers=self.xfers,
                        peers_gone=self.peers_gone)
        self.fetch_path, self.store_path, self.push_path = FetchPath(parts), StorePath(parts), PushPath(parts, self.m_xfer)
        self.prefetch = PrefetchPath(parts, cfg.prefetch_chunk_blocks, cfg.prefetch_share, StagedTable.create())
        self.pool.reclaim = self.prefetch.reclaim
        self.spawn(self.prefetch.sweep(), name="prefetch-sweep")
        s, e = self.subjects, cfg.engine
        await self.bus.subscribe(s.at(EP.HEARTBEAT), self._on_announce)
        await self.bus.subscribe(s.at(EP.TM_PUSH, engine=e), self._on_push)
        await self.bus.subscribe(s.at(EP.TM_RESERVE, engine=e), self._on_reserve)
        await self.bus.subscribe(s.at(EP.TM_LOAD, engine=e), self._on_load)
        await self.bus.subscribe(s.at(EP.TM_RELEASE, engine=e), self._on_release)
        await self.bus.subscribe(s.at(EP.TM_FETCH, engine=e), self._on_fetch)
        await self.bus.subscribe(s.at(EP.TM_SAVE, engine=e), self._on_save)
        await self.bus.subscribe(s.at(EP.TM_STAGE, engine=e), self._on_stage)
        await self.bus.subscribe(s.at(EP.TM_COMPUTED, engine=e), self._on_computed)
        await self.bus.subscribe(s.at(EP.TM_ALIVE, engine=e), self._on_alive)
        await self.bus.subscribe(parts.progress_subject, self._on_read_progress)
        await self.bus.subscribe(s.at(EP.TM_PREFETCH, engine=e), lambda msg, d: self.prefetch.on_prefetch(msg, d))
        await self.bus.subscribe(s.at(EP.TM_CLAIM, engine=e), lambda msg, d: self.prefetch.on_claim(msg, d))
        await install_pending(parts, self.prefetch, self.store_path)  # DE turns' saved blocks kept for the next
        await self.bus.subscribe(s.at(EP.CANCEL), self._on_release)
        self.bus.losses.on_reconnect.append(self._reconnected)

    def announce(self) -> TrafficManagerAnnounce:
        ep, pf = self.endpoint, self.prefetch  # shm_host: same-host prefill engines may copy its prefetches
        return TrafficManagerAnnounce(
            instance=self.instance, node=self.cfg.node, metrics_url=self.metrics_url, pid=os.getpid(), engine=self.cfg.engine,
            endpoint=_desc_encoder.encode(ep.desc()) if ep else b"", shm_host=shm_host(ep) if ep else "",
            buffer_bytes=self.pool.buffer.size, buffer_free_bytes=self.pool.free_bytes(), ready=self.kv_region is not None,
            prefetch_bytes=pf.staged_bytes() if pf else 0, prefetch_room_bytes=pf.room_bytes() if pf else 0)

    async def stop(self) -> None:
        for peer in self.peers.values():
            await peer.close()
        if self.endpoint:
            await self.endpoint.close()
        if self.prefetch is not None and self.prefetch.table is not None:
            self.prefetch.table.close()
        for region in (self.kv_region, self.pool.buffer):
            if region is not None:
                try:
                    region.close()
                except BufferError:
                    pass
        self.pool.buffer.unlink()

    # directory ------------------------------------------------------------------
    async def _on_announce(self, msg, d: Delivery) -> None:
        if isinstance(msg, StorageGatewayAnnounce):
            self.queues.note(msg)
        elif isinstance(msg, EngineAnnounce) and msg.engine == self.cfg.engine and msg.kv is not None:
            self._attach(msg.kv)
        elif isinstance(msg, TrafficManagerAnnounce) and msg.engine != self.cfg.engine and msg.endpoint:
            desc = None if msg.leaving else _desc_decoder.decode(msg.endpoint)
            old = self.remote.pop(msg.engine, None) if desc is None else self.remote.get(msg.engine)
            if desc is not None:
                self.remote[msg.engine] = desc
            if old is not None and (desc is None or not same_process(old, desc)):  # it left, or restarted:
                self.peers_gone.gone(msg.engine)  # requests to the old process end now, and its connection
                if (peer := self.peers.pop(msg.engine, None)) is not None:
                    self.spawn(peer.close(), name=f"close-peer-{msg.engine}")
            elif desc is not None and msg.engine in self.peers:
                self.peers[msg.engine].refresh(desc)

    def _attach(self, layout: KVRegion) -> None:
        if self.pool.layout is not None and self.pool.layout.shm_name == layout.shm_name:
            return
        if self.kv_region is not None:  # the engine restarted with new KV memory: the old one goes
            self.endpoint.unregister("kv")
            self.kv_region.close()
        self.kv_region = ShmRegion.attach(layout.shm_name)
        self.endpoint.register("kv", self.kv_region.buf, shm_name=layout.shm_name, remote=False)  # peers: buf only
        if self.prefetch is not None:  # first: its stamps go before the buffer is cut anew
            self.prefetch.reset()
        self.pool.attach(layout)
        log.info("attached KV memory %s (%d blocks)", layout.shm_name, layout.num_blocks)
        self.spawn(self.bus.publish(self.subjects.at(EP.ENGINE_TM, engine=self.cfg.engine),
                                    TmAttached(self.instance, layout.shm_name)),
                   name="tm-attached")

    async def peer(self, engine: str) -> Peer:
        """A data-plane connection to `engine`'s traffic manager, made on first use."""
        peer = self.peers.get(engine)
        if peer is None:
            desc = self.remote.get(engine)
            if desc is None:
                raise BusError(engine, "no traffic-manager announced for that engine")
            peer = self.peers[engine] = await self.endpoint.connect(desc)
        return peer

    # push (PE side, push.py) ----------------------------------------------------------
    async def _on_push(self, msg: PushKV, d: Delivery) -> None:
        state = self.layers.hold(msg.req_id) if msg.layerwise else None  # before any LayersComputed is handled
        self.spawn(self._push(msg, d, state), name=f"push-{msg.req_id}",
                   on_error=lambda exc: d.respond(PushDone(ok=False, error=_why(exc), code=ErrorCode.INTERNAL)))

    async def _push(self, msg: PushKV, d: Delivery, state) -> None:
        try:
            await self.push_path.push(msg, d, state)
        finally:
            if state is not None:
                self.layers.release(msg.req_id)

    async def _on_computed(self, msg: LayersComputed, d: Delivery) -> None:
        for req_id in msg.req_ids:
            self.layers.get(req_id).mark_computed(msg.layer)

    async def _on_alive(self, msg: ForwardAlive, d: Delivery) -> None:
        for req_id in msg.req_ids:  # progress for the waits of a push under way, nothing more
            state = self.layers.items.get(req_id)
            if state is not None:
                state.note()

    async def _on_read_progress(self, msg: LayersRead, d: Delivery) -> None:
        track = self.reads.items.get((msg.req_id, msg.tag))
        if track is None or track.final is not None:
            return  # the fetch is over (or its reply overtook this report)
        if track.opened is None:
            track.opened, track.eta_s = msg.blocks, msg.eta_s
        track.layers = max(track.layers, msg.layers)
        track.note()

    # reserve / load / release (DE side) --------------------------------------------------
    async def _on_reserve(self, msg: Reserve, d: Delivery) -> None:
        if not self.pool.ready:
            await d.respond(Reserved(ok=False, error=NOT_ATTACHED, code=ErrorCode.NOT_READY))
            return
        self.spawn(self._reserve(msg, d), name=f"reserve-{msg.req_id}",
                   on_error=lambda exc: d.respond(Reserved(ok=False, error=_why(exc), code=ErrorCode.INTERNAL)))

    async def _reserve(self, msg: Reserve, d: Delivery) -> None:
        with tracer.start_as_current_span("kv_reserve", context=d.ctx, attributes={
                "req_id": msg.req_id, "blocks": msg.n_blocks}), \
                self.xfers.begin(TransferKind.RESERVE, msg.req_id, T.RESERVING) as t:
            adopted = self.prefetch.adopt(msg.adopt, msg.adopt_block_keys, msg.req_id) if msg.adopt else []
            try:
                slots = await self.pool.allocate_wait(msg.req_id, msg.n_blocks - len(adopted))
            except OutOfSlots as exc:
                t.error = exc
                self.pool.free(msg.req_id)
                await d.respond(Reserved(ok=False, error=f"DE buffer full: {exc}", code=ErrorCode.BUFFER_FULL))
                return
        self.pool.note_free()
        self.reserved_on[msg.req_id] = self.bus.losses.current()
        bn = self.pool.block_nbytes
        offsets = adopted + [s * bn for s in slots]
        await d.respond(Reserved(slots=offsets, adopted=len(adopted), grant=self.given.give(msg.req_id, offsets, bn)))

    async def _on_load(self, msg: LoadKV, d: Delivery) -> None:
        if not self.pool.ready:
            await d.respond(PushDone(ok=False, error=NOT_ATTACHED, code=ErrorCode.NOT_READY))
            return
        self.spawn(self._load(msg, d), name=f"load-{msg.req_id}",
                   on_error=lambda exc: d.respond(PushDone(ok=False, error=_why(exc), code=ErrorCode.INTERNAL)))

    async def _load(self, msg: LoadKV, d: Delivery) -> None:
        bn = self.pool.block_nbytes
        nbytes = bn * len(msg.slots)
        t0 = time.perf_counter()
        with tracer.start_as_current_span("kv_h2d", context=d.ctx, attributes={
                "req_id": msg.req_id, "blocks": len(msg.slots), "bytes": nbytes}) as span, \
                self.xfers.begin(TransferKind.LOAD, msg.req_id, T.COPYING) as t:
            ops = [Op("buf", slot, "kv", b * bn, bn) for slot, b in zip(msg.slots, msg.dst_blocks)]
            try:
                await self.endpoint.copy_local(ops, TrafficClass.LATENCY, timeout=self.cfg.transfer_timeout_s)
            except Exception as exc:  # noqa: BLE001
                t.error = exc
                span.record_exception(exc)
                await d.respond(PushDone(ok=False, error=str(exc), code=ErrorCode.KV_TRANSFER))
                return
            finally:
                if msg.release:
                    self.pool.free(msg.req_id)
        dt = time.perf_counter() - t0
        self.m_bytes.labels("h2d").inc(nbytes)
        self.m_xfer.labels("h2d").observe(dt)
        await d.respond(PushDone(nbytes=nbytes, seconds=dt))

    def _slots_freed(self, owner: str) -> None:
        """The pool freed `owner`'s slots: its data-plane grant and its reservation's record end with them."""
        self.reserved_on.pop(owner, None)
        if self.given is not None:
            self.given.take_back(owner)

    def _reconnected(self) -> None:
        """Back on NATS: a Release or Cancel sent meanwhile may be lost, and the engines end what they held on
        the old connection; so each reservation made on it is freed here (its grant ends with it)."""
        slots = self.pool.slots
        for req_id in orphaned(self.reserved_on, lambda r: slots is not None and bool(slots.held(r))):
            log.warning("freeing %s's reservation: made before NATS was lost, its release may be lost", req_id)
            self.xfers.release(req_id)
            self.pool.free(req_id)
            self.held.drop(req_id)
            self.layers.fail(lambda key, r=req_id: key == r, "its traffic manager lost NATS")

    async def _on_release(self, msg, d: Delivery) -> None:
        self.xfers.release(msg.req_id)  # its transfers that fail from now on were released
        used = isinstance(msg, Release) and msg.used and self.prefetch and self.prefetch.used(msg)
        if not (used or self.prefetch and self.prefetch.drop(msg.req_id, "released")):
            self.pool.cancel(msg.req_id)  # also ends the grant of its slots (pool.on_free)
        self.held.drop(msg.req_id)
        self.layers.fail(lambda key: key == msg.req_id, "the request was released")

    # storage paths (fetch.py, store_path.py) -------------------------------------------------
    async def _on_fetch(self, msg: FetchKV, d: Delivery) -> None:
        """The engine waits on the fetch's progress messages: a failure is told there at once."""
        if not self.pool.ready:
            await self.bus.publish(self.subjects.at(EP.PE_LOADED, engine=self.cfg.engine),
                                   FetchFailed(msg.req_id, ErrorCode.NOT_READY, NOT_ATTACHED))
            return
        self.spawn(self.fetch_path.fetch(msg, d), name=f"fetch-{msg.req_id}")

    async def _on_stage(self, msg: Stage, d: Delivery) -> None:
        if not self.pool.ready:
            await d.respond(Staged(error=NOT_ATTACHED))
            return
        self.spawn(self.store_path.stage(msg, d), name=f"stage-{msg.req_id}",
                   on_error=lambda exc: d.respond(Staged(error=_why(exc))))

    async def _on_save(self, msg: SaveKV, d: Delivery) -> None:
        if not self.pool.ready:
            await d.respond(SaveCopied(0, error=NOT_ATTACHED))
            return
        self.spawn(self.store_path.save(msg, d), name=f"save-{msg.req_id}",
                   on_error=lambda exc: d.respond(SaveCopied(0, error=_why(exc))))


def main(argv: list[str] | None = None) -> int:
    return service_main("traffic_manager", TrafficManagerConfig, TrafficManagerService, argv)
