"""Latency isolation, measured the way the product runs: every TM is its own process.

Owns the isolation half of `python -m shared.transport.bench` (bench.py prints it).

Layout (one run per backend):
    target  process  the remote TM: owns region "buf" (a /dev/shm segment), serves frames
    main    process  the initiator TM: region "kv"; times latency-class pulls of layer
                     blocks from target (one 96 KiB block, and one layer of a batch of
                     hit blocks), idle and with bulk saturating the link
    bulk    process  (the "other TM" case) a second initiator pulling bulk from target
Bulk load is generated two ways, each measured against the same idle figure:
    same link   the initiator's own bulk pulls on the same peer (prefetch next to the
                critical path): the class scheduler of one endpoint arbitrates
    other TM    a separate process pulls bulk from the same target: the target endpoint
                arbitrates what it serves; the initiator only shares the host's CPUs
Bulk throughput is measured alone (no latency work) and while latency work runs.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from . import EndpointDesc, Grant, Op, ShmRegion, TrafficClass, create_endpoint, new_name

MIB = 1 << 20
BULK_AT = 32 * MIB  # bulk pulls use [BULK_AT, size); latency pulls use [0, BULK_AT)
BULK_PIECE = 1 * MIB  # one bulk op (a prefetched full block of many layers)
BULK_OPS = 16  # ops per bulk transfer


@dataclass(frozen=True)
class Figures:
    idle: float  # median seconds
    same_link: float
    other_tm: float


SECRET = "bench-isolation"  # the bench's processes form one little mesh (loopback, for seconds)


def _run(coro: Any) -> Any:
    import uvloop

    return uvloop.run(coro)


def bulk_ops(size: int, base: int = BULK_AT) -> list[Op]:
    n = min(BULK_OPS, (size - base) // BULK_PIECE)
    return [Op("kv", base + i * BULK_PIECE, "buf", base + i * BULK_PIECE, BULK_PIECE) for i in range(n)]


def layer_ops(block: int, n: int, base: int = 0) -> list[Op]:
    return [Op("kv", base + i * block, "buf", base + i * block, block) for i in range(n)]


def rotating(block: int, n: int) -> list[list[Op]]:
    """Every distinct pull of `n` blocks in [0, BULK_AT): the samples cycle through them, as a
    running prefill pulls a different layer each time. Pulling one range over and over would
    time a copy whose bytes sit in the CPU cache when idle, and are evicted by bulk."""
    span = n * block
    return [layer_ops(block, n, base) for base in range(0, BULK_AT - span + 1, span)]


# -- the target TM -----------------------------------------------------------------------

def target_main(backend: str, size: int, conn: Connection) -> None:
    _run(_target(backend, size, conn))


async def _target(backend: str, size: int, conn: Connection) -> None:
    ep = create_endpoint(backend, node="de", secret=SECRET)
    seg = ShmRegion.create(new_name("bt"), size)
    try:
        seg.buf[:] = bytes(size)
        await ep.start()
        ep.register("buf", seg.buf, shm_name=seg.name)
        conn.send_bytes(msgspec.msgpack.encode((ep.desc(), ep.grant("buf"))))  # what a Reserve reply carries
        await asyncio.get_running_loop().run_in_executor(None, conn.recv_bytes)  # until "stop"
    finally:
        await ep.close()
        seg.close()
        seg.unlink()


# -- an initiator TM: shared by main and the "other TM" bulk process ---------------------

class Initiator:
    def __init__(self, backend: str, desc: bytes, size: int, node: str) -> None:
        self.backend, self.size, self.node = backend, size, node
        self.remote, self.grant = msgspec.msgpack.decode(desc, type=tuple[EndpointDesc, Grant])

    async def __aenter__(self) -> Initiator:
        self.ep = create_endpoint(self.backend, node=self.node, secret=SECRET)
        self.seg = ShmRegion.create(new_name("bi"), self.size)
        await self.ep.start()
        self.ep.register("kv", self.seg.buf, shm_name=self.seg.name)
        self.peer = await self.ep.connect(self.remote)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.peer.close()
        await self.ep.close()
        self.seg.close()
        self.seg.unlink()

    async def bulk_until(self, stop: asyncio.Event | Any, poll: Any = None) -> tuple[int, float]:
        """Pull bulk back to back until `stop` is set; returns (bytes, seconds)."""
        ops, moved, t = bulk_ops(self.size), 0, time.perf_counter()
        while not (poll() if poll else stop.is_set()):
            await self.peer.read(ops, TrafficClass.BULK, grant=self.grant)
            moved += sum(o.length for o in ops)
        return moved, time.perf_counter() - t

    async def pull_times(self, pulls: list[list[Op]], samples: int) -> float:
        """Median seconds of one latency-class pull (1 ms apart), cycling through `pulls`."""
        ts = []
        for i in range(samples):
            t = time.perf_counter()
            await self.peer.read(pulls[i % len(pulls)], TrafficClass.LATENCY, grant=self.grant)
            ts.append(time.perf_counter() - t)
            await asyncio.sleep(0.001)
        return statistics.median(ts)


def bulk_main(backend: str, desc: bytes, size: int, conn: Connection) -> None:
    _run(_bulk(backend, desc, size, conn))


async def _bulk(backend: str, desc: bytes, size: int, conn: Connection) -> None:
    async with Initiator(backend, desc, size, "bulk") as ini:
        conn.send_bytes(b"ready")
        moved, dt = await ini.bulk_until(None, poll=conn.poll)
        conn.recv_bytes()
        conn.send_bytes(msgspec.msgpack.encode((moved, dt)))


# -- main: the measuring initiator -------------------------------------------------------

@dataclass
class Result:
    backend: str
    single: Figures
    layer: Figures
    bulk_alone: float  # GB/s, no latency work anywhere
    bulk_busy: float  # GB/s of the same-link bulk while latency pulls run


async def _measure(backend: str, desc: bytes, size: int, block: int, nblocks: int,
                   samples: int, ctx: Any) -> Result:
    async with Initiator(backend, desc, size, "pe") as ini:
        one, layer = rotating(block, 1), rotating(block, nblocks)
        await ini.pull_times(layer, 5)  # warm-up: maps, sockets, buffers
        idle1, idleN = await ini.pull_times(one, samples), await ini.pull_times(layer, samples)

        async def timed_bulk(seconds: float | None) -> tuple[int, float]:
            stop = asyncio.Event()
            task = asyncio.ensure_future(ini.bulk_until(stop))
            try:
                if seconds is not None:
                    await asyncio.sleep(seconds)
                else:
                    await asyncio.sleep(0.05)
                    figs.extend([await ini.pull_times(one, samples), await ini.pull_times(layer, samples)])
            finally:
                stop.set()
            return await task

        figs: list[float] = []
        moved, dt = await timed_bulk(1.0)
        alone = moved / dt / 1e9
        moved, dt = await timed_bulk(None)
        busy = moved / dt / 1e9
        same1, sameN = figs

        parent, child = ctx.Pipe()
        proc = ctx.Process(target=bulk_main, args=(backend, desc, size, child), daemon=True)
        proc.start()
        parent.recv_bytes()
        await asyncio.sleep(0.05)
        other1, otherN = await ini.pull_times(one, samples), await ini.pull_times(layer, samples)
        parent.send_bytes(b"stop")
        parent.recv_bytes()
        proc.join(10)
    return Result(backend, Figures(idle1, same1, other1), Figures(idleN, sameN, otherN), alone, busy)


def isolation(backend: str, size: int, block: int, nblocks: int, samples: int, rounds: int = 3) -> Result:
    """Start the target process, measure from this process `rounds` times, stop the target.

    Each round measures idle, same-link and other-TM back to back, so slow drift of a
    shared machine hits all three alike; every figure is the median over the rounds.
    """
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    target = ctx.Process(target=target_main, args=(backend, size, child), daemon=True)
    target.start()
    try:
        desc = parent.recv_bytes()
        runs = [_run(_measure(backend, desc, size, block, nblocks, samples, ctx)) for _ in range(max(1, rounds))]
    finally:
        parent.send_bytes(b"stop")
        target.join(10)
    return _median(runs)


def _median(runs: list[Result]) -> Result:
    def figs(get: Any) -> Figures:
        return Figures(*(statistics.median(getattr(get(r), f) for r in runs) for f in ("idle", "same_link", "other_tm")))

    return Result(runs[0].backend, figs(lambda r: r.single), figs(lambda r: r.layer),
                  statistics.median(r.bulk_alone for r in runs), statistics.median(r.bulk_busy for r in runs))


def report(r: Result, block: int, nblocks: int) -> list[str]:
    def line(what: str, f: Figures) -> str:
        pct = lambda x: f"{(x / f.idle - 1) * 100:+.0f}%"  # noqa: E731
        return (f"  {what:<22} idle {f.idle * 1e6:6.0f} us | bulk same link {f.same_link * 1e6:6.0f} us "
                f"{pct(f.same_link):>6} | bulk other TM {f.other_tm * 1e6:6.0f} us {pct(f.other_tm):>6}")

    return [
        f"latency class over {r.backend} (target TM in its own process), median pull time (median of rounds):",
        line(f"one {block >> 10} KiB block", r.single),
        line(f"layer of {nblocks} blocks", r.layer),
        f"  bulk pull throughput: alone {r.bulk_alone:.2f} GB/s | while latency pulls run {r.bulk_busy:.2f} GB/s",
    ]
