"""A scripted wire around one traffic manager's fetch and push (no NATS): every request (with its
subject, timeout and abort), publish, local copy and one-sided read or write is recorded; the
gateways, the DE's traffic manager and the clock are scripted by the test."""
from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from types import SimpleNamespace

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.traffic_manager.parts import TMParts
from services.traffic_manager.progress import LayerState, ReadTrack, Registry
from services.traffic_manager.read_queues import ReadQueues
from services.traffic_manager.slot_grants import GrantsGiven, GrantsHeld
from shared.messages.registry import KVRegion, StorageGatewayAnnounce
from shared.messages.storage_gateway import ReadBlocks, ReadDone, StoreLayout
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import FetchFailed, Reserve, Reserved, Stage, Staged
from shared.transport.grants import Grant, coalesce
from tests.unit.tm_util import buffer_pool

LAYERS, LB, SLOTS = 4, 1024, 16
BN = LAYERS * LB
LAYOUT = StoreLayout(b"f" * 16, "m", LAYERS, 1, 8, "float32", 16)
KV = KVRegion("kv", 32, 16, LAYERS, BN, LB)
SUBJECTS = Subjects("t")
PE, DE, PE_NODE, DE_NODE = "pe-1", "de-1", "n0", "n1"
DE_SLOT0 = 20  # the DE buffer's slots of a reservation: DE_SLOT0, DE_SLOT0 + 1, ... (in blocks)


class Clock:
    """`time.perf_counter` for the code under test: frozen (step 0) or one `step` per call."""

    def __init__(self, step: float = 0.0, start: float = 1000.0):
        self.now, self.step = start, step

    def perf_counter(self) -> float:
        self.now += self.step
        return self.now


class Endpoint:
    """This TM's data plane (local copies, grants) or a peer's (one-sided reads and writes): recorded."""

    def __init__(self, wire: "Wire", engine: str = ""):
        self.wire, self.engine = wire, engine

    def grant(self, region, ranges):
        return Grant(secrets.token_bytes(16), region, *coalesce(ranges))

    def revoke(self, g):
        pass

    async def copy_local(self, ops, cls, *, timeout=None):
        self.wire.moved.append(("copy", "", list(ops), cls, timeout, None))
        await self.wire.on_move("copy", list(ops))

    async def read(self, ops, cls, *, timeout=None, grant=None):
        self.wire.moved.append(("read", self.engine, list(ops), cls, timeout, grant))
        await self.wire.on_move("read", list(ops))

    async def write(self, ops, cls, *, timeout=None, grant=None):
        self.wire.moved.append(("write", self.engine, list(ops), cls, timeout, grant))
        await self.wire.on_move("write", list(ops))


class Wire:
    """The bus: gateways read `found[tag]` blocks (every layer streamed, then the reply), the DE's
    TM reserves DE_SLOT0.. and stages; `on[type]` replaces a reply, `hold` keeps a read's reply back."""

    def __init__(self):
        self.asked: list[tuple[str, object, float, object]] = []  # (subject, msg, timeout, abort)
        self.heard: list[tuple[str, object]] = []
        self.moved: list[tuple] = []  # (kind, peer, ops, class, timeout, grant)
        self.names: list[str] = []  # names tasks were spawned under
        self.reached: list[str] = []  # engines whose data plane was reached (`peer`)
        self.found: dict[str, int] = {}  # read tag -> leading blocks found (default: all)
        self.errors: dict[str, str] = {}  # read tag -> the reply's error
        self.hold: dict[str, asyncio.Event] = {}  # read tag -> its reply waits for this
        self.eta = {"pe": 0.123456, "de": 0.0625}  # read tag -> the eta its gateway reports
        self.streamed = LAYERS  # layers of a read in the buffer when it opens
        self.silent: set[str] = set()  # read tags whose gateway says nothing until the fetch failed
        self.failed = asyncio.Event()  # set once a FetchFailed went out
        self.on: dict[type, Callable[[object], Awaitable[object]]] = {}
        self.on_publish: Callable[[object], Awaitable[None]] | None = None
        self.on_move: Callable[[str, list], Awaitable[None]] = _nothing
        self.given = GrantsGiven(Endpoint(self))
        self.parts: TMParts | None = None

    def of(self, kind) -> list:
        return [m for _, m in self.heard if isinstance(m, kind)]

    async def publish(self, subject, msg, ctx=None):
        self.heard.append((subject, msg))
        if isinstance(msg, FetchFailed):
            self.failed.set()
            for gate in self.hold.values():
                gate.set()
        if self.on_publish is not None:
            await self.on_publish(msg)

    async def request(self, subject, msg, timeout=None, ctx=None, abort=None):
        self.asked.append((subject, msg, timeout, abort))
        if type(msg) in self.on:
            return await self.on[type(msg)](msg)
        if isinstance(msg, Reserve):
            offsets = [(DE_SLOT0 + i) * BN for i in range(msg.n_blocks)]
            return Reserved(slots=offsets, grant=self.given.give(msg.req_id, offsets, BN))
        if isinstance(msg, ReadBlocks):
            return await self._read(msg.req_id, msg.tag, len(msg.block_keys))
        assert isinstance(msg, Stage), msg
        done = await self._read(msg.req_id, "de", len(msg.block_keys))
        return Staged(slots=msg.slots, blocks=done.blocks, error=done.error)

    async def _read(self, req_id: str, tag: str, n: int) -> ReadDone:
        if tag in self.silent:
            await self.failed.wait()
            return ReadDone(error="given up")
        found = min(self.found.get(tag, n), n)
        track = self.parts.reads.get((req_id, tag))
        track.opened, track.eta_s, track.layers = found, self.eta[tag], self.streamed
        track.note()
        if tag in self.hold:
            await self.hold[tag].wait()
        return ReadDone(blocks=found, error=self.errors.get(tag, ""))

    async def peer(self, engine: str) -> Endpoint:
        self.reached.append(engine)
        return Endpoint(self, engine)

    def spawn(self, coro, name=None, **_):
        self.names.append(name)
        return asyncio.ensure_future(coro)


async def _nothing(kind, ops):
    return None


def parts(wire: Wire, prefix: str, timeout_s: float = 2.0, gateways=((0.0, 0), (0.0, 0)),
          claim_local=lambda owner, keys: []) -> tuple[TMParts, object, list]:
    """The PE-side TM's parts over a fresh buffer (close the region after), and what `drop_local` was told.
    `gateways`: the PE and DE nodes' gateways as (read rate in blocks/s (0: uncapped), blocks queued)."""
    region, pool, m = buffer_pool(prefix, SLOTS * BN, KV)
    queues = ReadQueues(timeout_s)
    for node, (rate, queued) in zip((PE_NODE, DE_NODE), gateways):
        queues.note(StorageGatewayAnnounce("i", node, read_q_bytes=queued * BN, read_bytes_per_s=rate * BN))
    dropped: list = []
    cfg = SimpleNamespace(transfer_timeout_s=timeout_s, engine=PE, read_layer_groups=2, transport="shm")
    p = TMParts(cfg, wire, SUBJECTS, m, pool, Endpoint(wire), wire.peer, queues,
                m.counter("bytes_total", "b", ("kind",)), wire.spawn, None, GrantsHeld(), Registry(ReadTrack),
                Registry(LayerState), claim_local=claim_local,
                drop_local=lambda owner, why: dropped.append((owner, why)) or True)
    wire.parts = p
    return p, region, dropped


def sample(p: TMParts, name: str, **labels) -> float | None:
    return p.metrics.registry.get_sample_value(f"dualpath_traffic_manager_{name}", labels)


def capture_spans(monkeypatch, module):
    """`module`'s spans into an in-memory exporter, its clock scripted: (exporter, a parent tracer)."""
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(module, "tracer", provider.get_tracer("test"))
    monkeypatch.setattr(module, "time", Clock())
    return exporter, provider.get_tracer("parent")
