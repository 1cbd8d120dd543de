"""An in-process mesh for the data path's invariant tests (no NATS, no processes): the prefill
engine's traffic manager (`pe0`, node nA: its real fetch, push and save over a real buffer pool)
and the decode engine's (`de0`, node nB: its real stage and save; `Reserve` answered from its
real pool), both nodes' storage gateways as recording stand-ins on the same bus, and a data plane
(local copies, one-sided reads and writes) that records every range it moves, so a test can say
which (block, layer) went where, when, and how often, and which keys reached a gateway's store."""
from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

from services.traffic_manager.fetch import FetchPath
from services.traffic_manager.parts import TMParts
from services.traffic_manager.progress import LayerState, ReadTrack, Registry
from services.traffic_manager.push import PushPath
from services.traffic_manager.read_queues import ReadQueues
from services.traffic_manager.slot_grants import GrantsGiven, GrantsHeld
from services.traffic_manager.store_path import StorePath
from shared.bus import Losses
from shared.messages.registry import KVRegion
from shared.messages.storage_gateway import ReadBlocks, ReadDone, StoreLayout, WriteBlock, WriteDone
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import (FetchKV, LayersComputed, PushKV, Reserve, Reserved, SaveCopied, SaveKV,
                                             Stage)
from shared.messages.work import Ack, DecodeAdmit
from shared.transport.base import Op
from shared.transport.errors import TransportError
from shared.transport.grants import Grant, coalesce
from tests.unit.tm_util import Reply, buffer_pool

BS, LAYERS, LB = 16, 4, 1024  # tokens per block, layers, bytes of one layer of one block
BLOCK = LAYERS * LB
SLOTS = 16
LAYOUT = StoreLayout(b"f" * 16, "m", LAYERS, 1, 8, "float32", BS)
KV = KVRegion("kv", SLOTS, BS, LAYERS, BLOCK, LB)
PE, DE, PE_NODE, DE_NODE = "pe0", "de0", "nA", "nB"
SUBJECTS = Subjects("t")
DE_ORDER = [11, 4, 9, 2, 14, 7, 0, 5, 12, 3]  # the DE buffer's slots, in the order it hands them out
HUGE = 600.0  # every deadline: a test that finishes did not wait for one


class Tasks:
    """`spawn` for every part: remembers its tasks, so a test can wait until all have run."""

    def __init__(self) -> None:
        self.all: list[asyncio.Task] = []

    def __call__(self, coro, name: str | None = None, **_) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self.all.append(task)
        return task

    async def settle(self) -> None:
        """Until every task spawned so far (and by them) is over; the first error is raised."""
        while pending := [t for t in self.all if not t.done()]:
            await asyncio.wait(pending)
        for t in self.all:
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()


@dataclass(frozen=True)
class Move:
    """One layer of one block moved between KV memory and a buffer: `peer` "" for a local copy."""

    peer: str
    kind: str  # "copy" (buffer -> KV memory), "save" (KV memory -> buffer), "read" (remote buffer -> KV), "write"
    kv_block: int
    layer: int
    buf_block: int  # byte offset of the block's slot in that buffer
    verified: bool  # the storage reads' checksums had passed when it moved (`Mesh.verified`)


def moves(peer: str, kind: str, ops: list[Op], verified: bool) -> Iterator[Move]:
    """Each op cut into (block, layer) pieces; the KV side is the op's side in region "kv"."""
    for op in ops:
        kv, buf = (op.local_offset, op.remote_offset) if op.local_region == "kv" else (op.remote_offset,
                                                                                       op.local_offset)
        for j in range(op.length // LB):
            layer = (kv % BLOCK) // LB + j
            yield Move(peer, kind, kv // BLOCK, layer, buf + j * LB - layer * LB, verified)


class Endpoint:
    """A traffic manager's endpoint (local copies, grants), or its peer `engine` (one-sided reads, writes)."""

    def __init__(self, mesh: "Mesh", engine: str = ""):
        self.mesh, self.engine = mesh, engine

    def grant(self, region, ranges):
        return Grant(secrets.token_bytes(16), region, *coalesce(ranges))

    def revoke(self, g):
        pass

    async def copy_local(self, ops, cls, *, timeout=None):
        kind = "copy" if ops and ops[0].remote_region == "kv" else "save"  # into KV memory, or out of it
        self.mesh.note(moves("", kind, list(ops), self.mesh.verified))

    async def read(self, ops, cls, *, timeout=None, grant=None):
        assert grant is not None, "a one-sided read without the holder's grant"
        self.mesh.note(moves(self.engine, "read", list(ops), self.mesh.verified))

    async def write(self, ops, cls, *, timeout=None, grant=None):
        assert grant is not None, "a one-sided write without the holder's grant"
        if self.mesh.refuse_writes:
            raise TransportError(self.mesh.refuse_writes)
        self.mesh.note(moves(self.engine, "write", list(ops), self.mesh.verified))


@dataclass
class Storage:
    """Both gateways: which keys each node read and wrote, how many of a read are found and verify."""

    reads: list[tuple[str, list[bytes]]] = field(default_factory=list)  # (node, keys) per read
    written: list[tuple[str, bytes]] = field(default_factory=list)  # (node, key) per block written
    found: dict[str, int] = field(default_factory=dict)  # tag ("pe", "de") -> leading blocks still stored
    passing: dict[str, int] = field(default_factory=dict)  # tag -> leading blocks that verify
    gate: asyncio.Event | None = None  # set: checksums checked (a read's reply waits for it)


def _tm(bus: "Mesh", engine: str, spawn: Tasks, given: GrantsGiven | None,
        claim_local: Callable[[str, list[bytes]], list[int]]) -> tuple[object, TMParts]:
    """A traffic manager's parts over a fresh 16-slot buffer: (its region, the parts)."""
    region, pool, m = buffer_pool(f"t-dp{engine}", SLOTS * BLOCK, KV)
    cfg = SimpleNamespace(transfer_timeout_s=HUGE, engine=engine, read_layer_groups=LAYERS, transport="shm",
                          save_wait_s=HUGE / 2, save_queue_blocks=SLOTS, fault_flip_de_bytes=False)
    return region, TMParts(cfg, bus, SUBJECTS, m, pool, Endpoint(bus), bus.peer, ReadQueues(HUGE),
                           m.counter("bytes_total", "b", ("kind",)), spawn, given, GrantsHeld(), Registry(ReadTrack),
                           Registry(LayerState), claim_local=claim_local)


class Mesh:
    """The bus. Requests: a gateway read (every layer streamed in, reported to the PE TM's read
    track, then the reply once `storage.gate` opens) or write (recorded), the DE TM's `Reserve`,
    `Stage` and saves, the PE TM's `PushKV` and saves, DE admission (`admit`)."""

    def __init__(self, spawn: Tasks, prefetched: list[int] = ()):
        """`prefetched`: buffer offsets of the leading hits staged in the PE TM's own buffer (claimed)."""
        self.losses = Losses()  # the real bus's: engines keep a request's connection
        self.spawn, self.storage = spawn, Storage()
        self.heard: list[tuple[str, object]] = []  # published
        self.asked: list[tuple[str, object]] = []  # requested
        self.refuse_saves: set[str] = set()  # subjects whose saves are answered "slots released"
        self.refuse_writes = ""  # set: every one-sided write fails with this error (a peer gone)
        self.reserved: dict[str, list[int]] = {}  # req_id -> its DE-buffer slots
        self.moved: list[Move] = []
        self.changed = asyncio.Event()  # set on every move
        self.admit: Callable[[DecodeAdmit], Awaitable[Ack]] = self._admit
        self.on_progress: Callable[[object], Awaitable[None]] | None = None  # the engine's fetch progress
        self.region, self.tm = _tm(self, PE, spawn, None, lambda owner, keys: list(prefetched)[:len(keys)])
        self.de_region, self.de_tm = _tm(self, DE, spawn, GrantsGiven(Endpoint(self)), lambda owner, keys: [])
        de_slots = self.de_tm.pool.slots
        de_slots.allocate("others", SLOTS)  # then freed so that it hands its slots out in DE_ORDER
        de_slots.release_slots("others", DE_ORDER)
        self.fetch_path = FetchPath(self.tm)
        self.push_path = PushPath(self.tm, self.tm.metrics.histogram("xfer_seconds", "x", ("kind",)))
        self.stores = {PE: StorePath(self.tm), DE: StorePath(self.de_tm)}

    @property
    def verified(self) -> bool:
        return self.storage.gate is None or self.storage.gate.is_set()

    def close(self) -> None:
        for region in (self.region, self.de_region):
            region.close()
            region.unlink()

    def note(self, got: Iterator[Move]) -> None:
        self.moved.extend(got)
        self.changed.set()

    async def peer(self, engine: str) -> "Endpoint":
        return Endpoint(self, engine)

    async def _admit(self, msg: DecodeAdmit) -> Ack:
        return Ack()

    async def publish(self, subject, msg, ctx=None):
        self.heard.append((subject, msg))
        if isinstance(msg, FetchKV):
            self.spawn(self.fetch_path.fetch(msg, SimpleNamespace(ctx=None)), name=f"tm-fetch-{msg.req_id}")
        elif isinstance(msg, LayersComputed):
            for req_id in msg.req_ids:
                self.tm.layers.get(req_id).mark_computed(msg.layer)
        elif subject == self.tm.loaded_subject and self.on_progress is not None:
            await self.on_progress(msg)

    async def request(self, subject, msg, timeout=None, ctx=None, abort=None):
        self.asked.append((subject, msg))
        engine = subject.split(".")[-2]
        if isinstance(msg, ReadBlocks):
            return await self._read(engine, msg)
        if isinstance(msg, WriteBlock):
            self.storage.written.append((engine, msg.block_key))
            return WriteDone(outcome="written")
        if isinstance(msg, Reserve):
            assert not msg.adopt, "no prefetch staged on the decode side here"
            slots = [s * BLOCK for s in await self.de_tm.pool.allocate_wait(msg.req_id, msg.n_blocks)]
            self.reserved[msg.req_id] = slots
            return Reserved(slots=slots, grant=self.de_tm.given.give(msg.req_id, slots, BLOCK))
        if isinstance(msg, DecodeAdmit):
            return await self.admit(msg)
        if isinstance(msg, SaveKV) and subject in self.refuse_saves:
            return SaveCopied(0, error="slots were released before the save")
        reply = Reply()
        reply.ctx = None
        if isinstance(msg, PushKV):
            await self._push(msg, reply)
        elif isinstance(msg, (SaveKV, Stage)):
            store = self.stores[engine]
            await (store.save(msg, reply) if isinstance(msg, SaveKV) else store.stage(msg, reply))
        else:
            raise AssertionError(f"no reply scripted for {type(msg).__name__} on {subject}")
        return reply.msg

    async def _push(self, msg: PushKV, reply: Reply) -> None:
        """As the PE TM's service: a layerwise push holds its layer state while it runs."""
        state = self.tm.layers.hold(msg.req_id) if msg.layerwise else None
        try:
            await self.push_path.push(msg, reply, state)
        finally:
            if state is not None:
                self.tm.layers.release(msg.req_id)

    async def _read(self, node: str, msg: ReadBlocks) -> ReadDone:
        """A gateway's read in layer groups: every layer of the blocks found lands (reported to the
        fetching TM's track), then, once the checksums are checked (`storage.gate`), the reply
        with the blocks that passed."""
        self.storage.reads.append((node, list(msg.block_keys)))
        n = min(self.storage.found.get(msg.tag, len(msg.block_keys)), len(msg.block_keys))
        if msg.progress:  # streamed, reported to the fetching TM
            track = self.tm.reads.get((msg.req_id, msg.tag))
            track.opened, track.layers = n, LAYERS  # every layer of the blocks found is in the buffer, unverified
            track.note()
        if self.storage.gate is not None:
            await self.storage.gate.wait()
        ok = min(self.storage.passing.get(msg.tag, n), n)
        missing = f"block {n}: not stored" if n < len(msg.block_keys) else ""
        error = f"block {ok}: checksum mismatch" if ok < n else missing
        return ReadDone(blocks=ok, error=error)
