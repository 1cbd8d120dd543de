"""The traffic-manager's fetch: a request's stored hit blocks into KV memory, layer by layer.

PE path: buffer slots <- this node's gateway reads Full Blocks (storage NIC). DE path: the
DE's traffic-manager stages the rest in its buffer (its node's gateway reads them). Blocks
prefetched during the session's tool call (`staged_*`) are claimed from whichever buffer
holds them and read from storage no more (in the request's DE's buffer they are adopted as
its first DE-buffer slots: read like DE-path hits, never pushed back); a claim that comes
back short leaves the rest to the PE path. Then, for each layer l: Layer Blocks buffer -> KV memory (local copy, one-sided
read from another traffic-manager's buffer), and `LayersLoaded(l)` to the engine, which
computes layer l while l+1.. are copied. Claimed prefetched slots are released at the end.
Before the read, a deep storage queue is announced (`ReadQueued`); after it, `ReadFinished`.

Every failure is answered on the wire, never by the engine's timeout: whatever ends a fetch
early (a transfer past its deadline, a peer gone, the bus, a bug) publishes
`FetchFailed(code, error)`. Before `ReadFinished` the engine takes it as a miss (it computes
the prompt); after, it fails the prefill waiting on the next layer at once. A transport or
bus error is expected (logged, `kv_transfer`); anything else (`internal`) is re-raised for
the supervisor to log and count.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from opentelemetry import trace

from services.traffic_manager.parts import TMParts
from shared.bus import BusError, Delivery, error_code
from shared.kv.allocator import OutOfSlots
from shared.messages.codes import ErrorCode
from shared.messages.storage_gateway import ReadBlocks, ReadDone
from shared.messages.traffic_manager import (Claim, Claimed, FetchFailed, FetchKV, LayersLoaded, ReadFinished,
                                             ReadQueued, Release, Reserve, Reserved, Stage, Staged)
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
    """How far one fetch got: what its failure message reports."""

    read: bool = False  # the storage read reported (ReadFinished sent)
    layers: int = 0  # layers 0..layers-1 are in KV memory


class FetchPath:
    def __init__(self, parts: TMParts):
        self.p = parts
        self.m_wait = parts.metrics.histogram("fetch_seconds", "Storage read time of a fetch", ("phase",))

    async def fetch(self, msg: FetchKV, d: Delivery) -> None:
        """Load a request's hit blocks: keys[:k] on the PE path, keys[k:] on the DE path."""
        n = len(msg.keys)
        k = min(max(msg.pe_blocks, 0), n)
        owner, prog = f"{msg.req_id}/fetch", Progress()
        with tracer.start_as_current_span("kv_fetch", context=d.ctx, attributes={
                "req_id": msg.req_id, "blocks": n, "pe_path_blocks": k, "de_path_blocks": n - k,
                "pe_node": msg.node, "de_node": msg.de_node}) as span:
            try:
                await self._run(msg, k, owner, prog, span)
            except Exception as exc:  # noqa: BLE001 - answered on the wire; a bug goes on to the supervisor
                span.record_exception(exc)
                await self.failed(msg, prog, exc)
                if not isinstance(exc, EXPECTED):
                    raise
            finally:
                self.p.pool.release(owner)
                if msg.staged_owner:
                    await self._release_staged(msg)

    async def failed(self, msg: FetchKV, prog: Progress, exc: Exception) -> None:
        """Tell the engine the fetch ended early, and how far it got."""
        why = exc.reason if isinstance(exc, BusError) else f"{type(exc).__name__}: {exc}"
        code = error_code(exc, ErrorCode.KV_TRANSFER if isinstance(exc, EXPECTED) else ErrorCode.INTERNAL)
        log.warning("fetch %s failed (read %s, %d layers in place): %s: %s", msg.req_id,
                    "done" if prog.read else "not done", prog.layers, code, why)
        await self.p.bus.publish(self.p.loaded_subject, FetchFailed(msg.req_id, code, why, prog.layers))

    async def _run(self, msg: FetchKV, k: int, owner: str, prog: Progress, span) -> None:
        p = self.p
        t0 = time.perf_counter()
        # prefetched: keys[:c] already sit in a buffer (the DE's: adopted into the prompt's slots there)
        reserved = await self._reserve_remote(msg, adopt=True) if self._adopts(msg) else None
        reserved = reserved if reserved is not None and reserved.ok else None
        staged, staged_grant = ([], None) if reserved is not None else await self._claim(msg)
        c = reserved.adopted if reserved is not None else len(staged)
        k = max(k, c)
        await self._announce_queue(msg, c, k)
        (pe_ok, offsets, pe_err), de = await self._both_paths(msg, c, k, owner, reserved)
        self.m_wait.labels("read").observe(time.perf_counter() - t0)
        de_ok = de.blocks if de else 0
        hits = c + pe_ok if pe_ok < k - c else k + de_ok
        de_hits = (list(range(c)) if reserved is not None else []) + list(range(k, hits))
        span.set_attributes({"blocks_ok": hits, "pe_ok": pe_ok, "de_ok": de_ok, "prefetched_blocks": c,
                             "read_at_arrival_blocks": hits - c, "error": pe_err or (de.error if de else "")})
        # a short read's error only means fewer hits: the rest of the prompt is computed
        await p.bus.publish(p.loaded_subject, ReadFinished(
            msg.req_id, hits, de_slots=de.slots if de else [], de_hits=de_hits))
        prog.read = True
        grant = p.held.keep(msg.req_id, msg.de_engine, de.grant) if de else None  # also for the push
        if hits:
            local = list(zip(offsets[:min(pe_ok, hits - c)], msg.dst_blocks[c:]))
            remote = [(msg.de_engine, [(de.slots[i], msg.dst_blocks[i]) for i in de_hits], grant)] if de_hits else []
            pairs = list(zip(staged, msg.dst_blocks))
            if msg.staged_engine == p.cfg.engine:
                local = pairs + local
            elif pairs:  # one-sided reads from the holder, under the grant its claim gave
                remote.append((msg.staged_engine, pairs, staged_grant))
            await self._layers(msg, local, remote, prog)
            p.m_bytes.labels("de_path_pull").inc(len(de_hits) * p.pool.block_nbytes)
            p.m_bytes.labels("prefetch_used").inc(c * p.pool.block_nbytes)

    def _adopts(self, msg: FetchKV) -> bool:
        """Prefetched into the request's own DE's buffer (not this one): that TM adopts them."""
        return bool(msg.staged_owner and msg.staged_blocks > 0 and msg.staged_engine == msg.de_engine
                    and msg.de_engine != self.p.cfg.engine)

    async def _claim(self, msg: FetchKV) -> tuple[list[int], Grant | None]:
        """Buffer offsets of the leading prefetched blocks still staged for this fetch ([]: none),
        with the holder's grant of them when the holder is another traffic-manager."""
        p, n = self.p, min(msg.staged_blocks, len(msg.keys))
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

    async def _release_staged(self, msg: FetchKV) -> None:
        """The prefetched slots are copied (or the fetch ended): their buffer takes them back."""
        p = self.p
        if msg.staged_engine == p.cfg.engine:
            p.drop_local(msg.staged_owner, "used")
            return
        try:
            await p.bus.publish(p.subjects.tm(msg.staged_engine, "release"), Release(msg.staged_owner))
        except BusError as exc:  # its TTL or claim lease frees them
            log.warning("release of prefetched %s not sent: %s", msg.staged_owner, exc.reason)

    async def _announce_queue(self, msg: FetchKV, c: int, k: int) -> None:
        """Tell the engine when its read waits behind a storage queue long enough to matter for
        its fetch deadline (`ReadQueued`): deep queues are what a storage-bound node looks like."""
        p, n, bn = self.p, len(msg.keys), self.p.pool.block_nbytes
        wait = max(p.queues.queue_wait(msg.node, (k - c) * bn),
                   p.queues.queue_wait(msg.de_node, (n - k) * bn) if k < n else 0.0)
        if wait > 0.25 * p.cfg.transfer_timeout_s:
            await p.bus.publish(p.loaded_subject, ReadQueued(msg.req_id, round(wait, 3)))

    async def _read_local(self, msg: FetchKV, keys: list[bytes], owner: str) -> tuple[int, list[int], str]:
        """PE path: this node's gateway reads `keys` into this TM's buffer."""
        p = self.p
        if not keys:
            return 0, [], ""
        try:
            slots = await p.pool.allocate_wait(owner, len(keys))
        except OutOfSlots as exc:
            return 0, [], f"PE buffer full: {exc}"
        bn = p.pool.block_nbytes
        offsets = [s * bn for s in slots]
        try:
            with p.queues.read_at(msg.node, len(keys) * bn):
                done = await p.bus.request(p.subjects.sg(msg.node, "read"),
                                           ReadBlocks(msg.req_id, msg.layout, keys, p.pool.buffer.name, offsets),
                                           ReadDone, timeout=p.queues.deadline(msg.node, len(keys) * bn))
        except BusError as exc:
            return 0, offsets, exc.reason
        return done.blocks, offsets, done.error

    async def _reserve_remote(self, msg: FetchKV, adopt: bool = False) -> Reserved:
        """A split read first holds the prompt's DE-buffer slots, and only then takes PE-buffer
        slots: one order for the two buffers, so no two fetches each hold one and wait for the
        other (with both buffers full that hold-and-wait stalled every split until its deadline).
        With `adopt`, the blocks prefetched into that buffer become the first of those slots."""
        p = self.p
        ask = Reserve(msg.req_id, msg.prompt_blocks, adopt=msg.staged_owner if adopt else "",
                      adopt_keys=msg.keys[:msg.staged_blocks] if adopt else [])
        try:
            return await p.bus.request(p.subjects.tm(msg.de_engine, "reserve"), ask, Reserved,
                                       timeout=p.cfg.transfer_timeout_s)
        except BusError as exc:
            return Reserved(ok=False, error=exc.reason)

    async def _stage_remote(self, msg: FetchKV, k: int, slots: list[int] | None = None) -> Staged:
        """DE path: the DE's TM reserves the prompt's slots (unless given) and its gateway reads
        keys[k:] into them."""
        p = self.p
        nbytes = (len(msg.keys) - k) * p.pool.block_nbytes
        try:
            with p.queues.read_at(msg.de_node, nbytes):
                return await p.bus.request(
                    p.subjects.tm(msg.de_engine, "stage"),
                    Stage(msg.req_id, msg.prompt_blocks, k, msg.keys[k:], msg.de_node, msg.layout, slots=slots or []),
                    Staged, timeout=p.queues.deadline(msg.de_node, nbytes))
        except BusError as exc:
            return Staged(error=exc.reason)

    async def _both_paths(self, msg: FetchKV, c: int, k: int, owner: str, reserved: Reserved | None = None):
        """Read keys[c:k] on the PE path and keys[k:] on the DE path at the same time (keys[:c]
        were prefetched; `reserved`: the DE-buffer slots are held already)."""
        n = len(msg.keys)
        if reserved is not None:
            if k == n:
                staged = Staged(slots=reserved.slots, grant=reserved.grant)
                return await self._read_local(msg, msg.keys[c:], owner), staged
            return await asyncio.gather(self._read_local(msg, msg.keys[c:k], owner),
                                        self._stage_remote(msg, k, reserved.slots))
        if k == n:
            return await self._read_local(msg, msg.keys[c:], owner), None
        if k == c:
            return (0, [], ""), await self._stage_remote(msg, k)
        res = await self._reserve_remote(msg)
        if not res.ok:  # no DE-buffer room: the PE path alone; the rest is computed
            return await self._read_local(msg, msg.keys[c:k], owner), Staged(error=res.error)
        return await asyncio.gather(self._read_local(msg, msg.keys[c:k], owner),
                                    self._stage_remote(msg, k, res.slots))

    async def _layers(self, msg: FetchKV, local: list[tuple[int, int]],
                      remote: list[tuple[str, list[tuple[int, int]], Grant | None]], prog: Progress) -> None:
        """Layer after layer: this buffer's blocks by local copy, other buffers' (the DE's, a
        prefetch holder's) by one-sided reads under the grant each gave. Every copy of a layer
        settles before a failure of any is raised (nothing of this fetch is still moving when the
        engine hears of it)."""
        p, lay = self.p, self.p.pool.layout
        lb, bn, timeout = lay.layer_block_nbytes, lay.block_nbytes, p.cfg.transfer_timeout_s
        peers = [(await p.peer(engine), pairs, grant) for engine, pairs, grant in remote]
        t0 = last = time.perf_counter()
        for layer in range(lay.n_layers):
            loc = [Op("buf", off + layer * lb, "kv", b * bn + layer * lb, lb) for off, b in local]
            copies = [p.endpoint.copy_local(loc, TrafficClass.LATENCY, timeout=timeout)] if loc else []
            for peer, pairs, grant in peers:
                rem = [Op("kv", b * bn + layer * lb, "buf", off + layer * lb, lb) for off, b in pairs]
                copies.append(peer.read(rem, TrafficClass.LATENCY, timeout=timeout, grant=grant))
            for res in await asyncio.gather(*copies, return_exceptions=True):
                if isinstance(res, BaseException):
                    raise res
            prog.layers = layer + 1
            now = time.perf_counter()
            if layer == lay.n_layers - 1 or now - last >= LAYER_NOTIFY_GAP_S:
                await p.bus.publish(p.loaded_subject, LayersLoaded(msg.req_id, layer))
                last = now
        p.m_bytes.labels("h2d_layers").inc(bn * len(local))
        self.m_wait.labels("h2d").observe(time.perf_counter() - t0)

