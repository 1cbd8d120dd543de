"""The traffic-manager's fetch: a request's stored hit blocks into KV memory, layer by layer.

Hits come prefetched, read by this node's gateway (PE path) or staged in the DE's buffer (DE
path); layer l goes into KV memory once every read has it, the last only after every checksum
passed. Every failure is answered on the wire (`FetchFailed`), never left to the engine's timeout."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from opentelemetry import trace

from services.traffic_manager import staged
from services.traffic_manager.parts import TMParts
from services.traffic_manager.progress import ReadTrack
from services.traffic_manager.transfers import TransferKind, Transfer
from services.traffic_manager.transfers import TransferState as T
from shared.bus import BusError, Delivery, error_code
from shared.kv.allocator import OutOfSlots
from shared.kv.window import HitWindow, layer_blocks
from shared.messages.codes import ErrorCode
from shared.messages.endpoints import EP
from shared.messages.storage_gateway import ReadBlocks
from shared.messages.traffic_manager import (FetchFailed, FetchKV, LayersLoaded, NodeReadDone, ReadFinished,
                                             ReadQueued, Reserve, Reserved, Stage)
from shared.transport.base import Op, TrafficClass
from shared.transport.errors import TransportError
from shared.transport.grants import Grant, decode_grant

log = logging.getLogger("traffic_manager.fetch")
tracer = trace.get_tracer("traffic_manager")
# Layers copied within this long of the last `LayersLoaded` are announced together (the
# message names the highest layer in place): a small model's layers copy in microseconds,
# and one message per layer would cost more CPU than the copies. A layer that takes
# longer than this is still announced the moment it lands.
LAYER_NOTIFY_GAP_S = 0.001
EXPECTED = (TransportError, BusError)  # failures of the path, not of this code


@dataclass
class Progress:
    read: bool = False  # the storage read reported (ReadFinished sent)
    layers: int = 0  # layers 0..layers-1 are in KV memory
    xfer: Transfer | None = None  # the fetch's transfer (its state: transfers.py)


@dataclass
class Reads:
    """Where a fetch's hits come from: keys[:c] prefetched (`held` or `adopted`), keys[c:k] on the PE
    path into `offsets`, keys[k:n] on the DE path into `de_slots`."""

    n: int
    k: int
    c: int
    adopted: int
    held: list[int]
    held_grant: Grant | None
    de_slots: list[int]
    grant: Grant | None  # the DE's grant of the prompt's slots: for the DE-path pull and, later, the push
    offsets: list[int]


class FetchPath:
    def __init__(self, parts: TMParts):
        self.p = parts
        self.m_wait = parts.metrics.histogram("fetch_seconds", "Storage read time of a fetch", ("phase",))

    async def fetch(self, msg: FetchKV, d: Delivery) -> None:
        """Load a request's hit blocks: keys[:k] on the PE path, keys[k:] on the DE path."""
        n = len(msg.block_keys)
        k = min(max(msg.pe_blocks, 0), n)
        owner, prog = f"{msg.req_id}/fetch", Progress()
        tracks = {tag: self.p.reads.hold((msg.req_id, tag)) for tag in ("pe", "de")}
        local: list[asyncio.Task] = []  # the PE-path read, once started: its slots are freed after it
        with tracer.start_as_current_span("kv_fetch", context=d.ctx, attributes={
                "req_id": msg.req_id, "blocks": n, "pe_path_blocks": k, "de_path_blocks": n - k,
                "pe_node": msg.node, "de_node": msg.de_node}) as span, \
                self.p.xfers.begin(TransferKind.FETCH, msg.req_id, T.RESERVING) as prog.xfer:
            try:
                await self._run(msg, k, owner, prog, span, tracks, local)
            except Exception as exc:  # noqa: BLE001 - answered on the wire; a bug goes on to the supervisor
                prog.xfer.error = exc  # it ends once its slots are let go
                span.record_exception(exc)
                await self.failed(msg, prog, exc)
                if not isinstance(exc, EXPECTED):
                    raise
            finally:
                if local:  # the gateway may still be writing into the slots
                    await asyncio.wait(local)
                for tag in tracks:
                    self.p.reads.release((msg.req_id, tag))
                self.p.pool.release(owner)
                if msg.staged_owner:
                    await staged.release(self.p, msg)

    async def failed(self, msg: FetchKV, prog: Progress, exc: Exception) -> None:
        why = exc.reason if isinstance(exc, BusError) else f"{type(exc).__name__}: {exc}"
        code = error_code(exc, ErrorCode.KV_TRANSFER if isinstance(exc, EXPECTED) else ErrorCode.INTERNAL)
        read = "done" if prog.read else "not done"  # pragma: no mutate
        log.warning("fetch %s failed (read %s, %d layers in place): %s: %s",  # pragma: no mutate
                    msg.req_id, read, prog.layers, code, why)  # pragma: no mutate
        await self.p.bus.publish(self.p.loaded_subject, FetchFailed(msg.req_id, code, why, prog.layers))

    async def _run(self, msg: FetchKV, k: int, owner: str, prog: Progress, span, tracks,
                   local: list[asyncio.Task]) -> None:
        p = self.p
        t0 = time.perf_counter()
        pe, de = tracks["pe"], tracks["de"]
        r = await self._start(msg, k, owner, pe, de, local)
        p.xfers.move(prog.xfer, T.READING)
        c, k, bn = r.c, r.k, p.pool.block_nbytes
        timeout = max(p.queues.deadline(msg.node, (k - c) * bn), p.queues.deadline(msg.de_node, (r.n - k) * bn))
        await pe.until(lambda: pe.opened is not None, timeout, "PE-path read opened")
        await de.until(lambda: de.opened is not None, timeout, "DE-path read opened")
        pe_ok, de_ok = pe.opened, de.opened
        hits = c + pe_ok if pe_ok < k - c else k + de_ok
        de_hits = list(range(r.adopted)) + list(range(k, hits))
        span.set_attributes({"blocks_ok": hits, "pe_ok": pe_ok, "de_ok": de_ok, "prefetched_blocks": c,
                             "read_at_arrival_blocks": hits - c, "error": pe.final_error or de.final_error})
        if hits and hits == c and msg.window is None:  # every hit prefetched: all layers in one go
            p.xfers.move(prog.xfer, T.COPYING)
            src = staged.Held(r.held, r.held_grant, r.de_slots[:r.adopted], r.grant)
            await staged.copy_all(p, msg, src, prog, self.m_wait, r.de_slots, de_hits)
            return
        # a short read's error only means fewer hits: the rest of the prompt is computed; slots no read
        # fills (an adopt found its prefetch gone) are told too: the push uses them, never reserves twice
        await p.bus.publish(p.loaded_subject, ReadFinished(
            msg.req_id, hits, de_slots=r.de_slots if de_hits or k >= r.n else [], de_hits=de_hits,
            eta_s=round(max(pe.eta_s, de.eta_s), 4), staged=c, de_read=hits - min(k, hits)))
        prog.read = True
        if hits:
            p.xfers.move(prog.xfer, T.COPYING)
            pe_used, de_used = min(pe_ok, hits - c), max(hits - k, 0)
            local = [(off, c + j) for j, off in enumerate(r.offsets[:pe_used])]
            remote = [(msg.de_engine, [(r.de_slots[i], i) for i in de_hits], r.grant)] if de_hits else []
            pairs = [(off, i) for i, off in enumerate(r.held)]
            if msg.staged_engine == p.cfg.engine:
                local = pairs + local
            elif pairs:  # one-sided reads from the holder, under the grant its claim gave
                remote.append((msg.staged_engine, pairs, r.held_grant))
            await self._layers(msg, local, remote, prog, ((pe, pe_used), (de, de_used)), timeout)
            p.m_bytes.labels("de_path_pull").inc(len(de_hits) * bn)
            p.m_bytes.labels("prefetch_used").inc(c * bn)
        self.m_wait.labels("read").observe(time.perf_counter() - t0)

    async def _start(self, msg: FetchKV, k: int, owner: str, pe: ReadTrack, de: ReadTrack,
                     local: list[asyncio.Task]) -> Reads:
        """Hold every read's slots (prefetched, then DE buffer, then PE buffer) and start the reads."""
        p, n = self.p, len(msg.block_keys)
        # prefetched: keys[:c] already sit in a buffer (the DE's: adopted into the prompt's slots there)
        res = await self._reserve_remote(msg, adopt=True) if staged.adopts(p, msg) else None
        res = res if res is not None and res.ok else None
        held, held_grant = ([], None) if res is not None else await staged.claim(p, msg)
        adopted = res.adopted if res is not None else 0
        c = adopted or len(held)
        k = max(k, c)
        await self._announce_queue(msg, c, k)
        if res is None and k < n:
            res = await self._reserve_remote(msg)
            if not res.ok:  # no DE-buffer room: the PE path alone; the rest is computed
                de.finish(0, res.error)
                n, res = k, None
                await self._reads_done(msg.req_id, msg.de_node)
        de_slots = res.slots if res is not None else []
        grant = p.held.keep(msg.req_id, msg.de_engine, res.grant) if res is not None else None
        offsets: list[int] = []
        if k > c:
            offsets = await self._start_local(msg, msg.block_keys[c:k], owner, pe, local)
        else:
            pe.finish(0)
        if k < n:
            p.spawn(self._stage_remote(msg, k, de_slots, de), name=f"stage-{msg.req_id}")
        else:
            de.finish(0, de.final_error)
        return Reads(n, k, c, adopted, held, held_grant, de_slots, grant, offsets)

    async def _announce_queue(self, msg: FetchKV, c: int, k: int) -> None:
        """Tell the engine when its read waits behind a storage queue long enough to matter (`ReadQueued`)."""
        p, n, bn = self.p, len(msg.block_keys), self.p.pool.block_nbytes
        wait = max(p.queues.queue_wait(msg.node, (k - c) * bn),
                   p.queues.queue_wait(msg.de_node, (n - k) * bn) if k < n else 0.0)
        if wait > 0.25 * p.cfg.transfer_timeout_s:
            await p.bus.publish(p.loaded_subject, ReadQueued(msg.req_id, round(wait, 3)))

    async def _start_local(self, msg: FetchKV, keys: list[bytes], owner: str, track: ReadTrack,
                           local: list[asyncio.Task]) -> list[int]:
        p = self.p
        try:
            slots = await p.pool.allocate_wait(owner, len(keys))
        except OutOfSlots as exc:
            track.finish(0, f"PE buffer full: {exc}")
            return []
        offsets = [s * p.pool.block_nbytes for s in slots]
        local.append(p.spawn(self._read_local(msg, keys, offsets, track), name=f"read-{msg.req_id}"))
        return offsets

    async def _read_local(self, msg: FetchKV, keys: list[bytes], offsets: list[int], track: ReadTrack) -> None:
        p, nbytes = self.p, len(keys) * self.p.pool.block_nbytes
        try:
            with p.queues.read_at(msg.node, nbytes):
                done = await p.bus.request(p.subjects.at(EP.SG_READ, node=msg.node), ReadBlocks(
                    msg.req_id, msg.layout, keys, p.pool.buffer.name, offsets, group_layers=p.group_layers,
                    progress=p.progress_subject, tag="pe"), timeout=p.queues.deadline(msg.node, nbytes))
            track.finish(done.blocks, done.error or done.stop_reason)
        except BusError as exc:
            track.finish(0, exc.reason)
        finally:
            await self._reads_done(msg.req_id, msg.node)

    async def _reserve_remote(self, msg: FetchKV, adopt: bool = False) -> Reserved:
        """The prompt's DE-buffer slots are held before any PE-buffer slot: one order for the two buffers, so
        two fetches never each hold one and wait for the other. With `adopt`, prefetched blocks come first."""
        p = self.p
        ask = Reserve(msg.req_id, msg.prompt_blocks, adopt=msg.staged_owner if adopt else "",
                      adopt_block_keys=msg.block_keys[:msg.staged_blocks] if adopt else [])
        try:
            return await p.bus.request(p.subjects.at(EP.TM_RESERVE, engine=msg.de_engine), ask,
                                       timeout=p.cfg.transfer_timeout_s, abort=p.peers_gone.future(msg.de_engine))
        except BusError as exc:
            return Reserved(ok=False, error=exc.reason)

    async def _stage_remote(self, msg: FetchKV, k: int, slots: list[int], track: ReadTrack) -> None:
        """DE path: the DE's TM has its gateway read keys[k:] into the reserved slots."""
        p, nbytes = self.p, (len(msg.block_keys) - k) * self.p.pool.block_nbytes
        try:
            with p.queues.read_at(msg.de_node, nbytes):
                done = await p.bus.request(
                    p.subjects.at(EP.TM_STAGE, engine=msg.de_engine),
                    Stage(msg.req_id, msg.prompt_blocks, k, msg.block_keys[k:], msg.de_node, msg.layout, slots=slots,
                          group_layers=p.group_layers, progress=p.progress_subject),
                    timeout=p.queues.deadline(msg.de_node, nbytes), abort=p.peers_gone.future(msg.de_engine))
            track.finish(done.blocks, done.error)
        except BusError as exc:
            track.finish(0, exc.reason)
        finally:
            await self._reads_done(msg.req_id, msg.de_node)

    async def _reads_done(self, req_id: str, node: str) -> None:
        await self.p.bus.publish(self.p.subjects.at(EP.READS_DONE), NodeReadDone(req_id, node))

    async def _layers(self, msg: FetchKV, local: list[tuple[int, int]],
                      remote: list[tuple[str, list[tuple[int, int]], Grant | None]], prog: Progress,
                      reads: tuple[tuple[ReadTrack, int], ...], timeout: float) -> None:
        """Layer after layer, once read, into KV memory: local copies and one-sided reads of other buffers.
        Every copy of a layer settles before any failure is raised."""
        p, lay = self.p, self.p.pool.layout
        lb, n_layers, xfer = lay.layer_block_nbytes, lay.n_layers, p.cfg.transfer_timeout_s
        window = HitWindow.of(msg.window, n_layers)
        state = p.layers.hold(msg.req_id) if window else None
        try:
            peers = [(await p.peer(engine), pairs, grant) for engine, pairs, grant in remote]
            t0 = last = time.perf_counter()
            sent = 0  # layers 0..sent-1 announced to the engine (LayersLoaded)
            for layer in range(n_layers):
                before = window.released_before(layer) if state is not None else -1
                if sent < layer and not (all(t.has(layer, layer == n_layers - 1) for t, used in reads if used)
                                         and (before < 0 or state.pushed > before)):
                    # about to wait: the engine hears first what is in place (a reused window slot waits
                    # for the forward to compute those layers; announced later, it would wait for ever)
                    await p.bus.publish(p.loaded_subject, LayersLoaded(msg.req_id, layer - 1))
                    sent, last = layer, time.perf_counter()
                await _landed(layer, n_layers, reads, timeout)
                if before >= 0:
                    await state.until(lambda: state.pushed > before, timeout, f"layer {before} pushed on")
                dst = [b * lb for b in layer_blocks(msg.dst_blocks, layer, n_layers, window)]
                loc = [Op("buf", off + layer * lb, "kv", dst[i], lb) for off, i in local]
                copies = [p.endpoint.copy_local(loc, TrafficClass.LATENCY, timeout=xfer)] if loc else []
                for peer, pairs, grant in peers:
                    rem = [Op("kv", dst[i], "buf", off + layer * lb, lb) for off, i in pairs]
                    copies.append(peer.read(rem, TrafficClass.LATENCY, timeout=xfer, grant=grant))
                for res in await asyncio.gather(*copies, return_exceptions=True):
                    if isinstance(res, BaseException):
                        raise res
                prog.layers = layer + 1
                now = time.perf_counter()
                if layer == n_layers - 1 or now - last >= LAYER_NOTIFY_GAP_S:
                    await p.bus.publish(p.loaded_subject, LayersLoaded(msg.req_id, layer))
                    sent, last = layer + 1, now
        except (LookupError, RuntimeError) as exc:
            raise BusError("fetch", str(exc), ErrorCode.STORAGE) from None
        finally:
            if state is not None:
                p.layers.release(msg.req_id)
        p.m_bytes.labels("h2d_layers").inc(lay.block_nbytes * len(local))
        self.m_wait.labels("h2d").observe(time.perf_counter() - t0)


async def _landed(layer: int, n_layers: int, reads: tuple[tuple[ReadTrack, int], ...], timeout: float) -> None:
    """Layer `layer` of every read is in the buffers; the last one only once their checksums passed."""
    last = layer == n_layers - 1
    for track, used in reads:
        if not used:
            continue
        await track.until(lambda: track.has(layer, last), timeout, f"layer {layer} read from storage")
        if track.final is not None and track.final < used:
            raise BusError("read", f"block {track.final} failed verification after its layers were read: "
                                   f"{track.final_error}", ErrorCode.STORAGE)
