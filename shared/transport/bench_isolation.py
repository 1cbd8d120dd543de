"""Latency isolation, measured the way the product runs: every TM is its own process."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from . import EndpointDesc, Grant, Op, ShmRegion, TrafficClass, create_endpoint, new_name

MIB = 1 << 20
BULK_AT = 32 * MIB  # bulk pulls use [BULK_AT, size); latency pulls use [0, BULK_AT)
BULK_PIECE = 1 * MIB  # one bulk op (a prefetched full block of many layers)
BULK_OPS = 16  # ops per bulk transfer
WINDOWS = 6  # idle / same-link / other-TM windows per round, interleaved


@dataclass(frozen=True)
class IsolationFigures:
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
    """Every distinct pull of `n` blocks in [0, BULK_AT), cycled so that no sample times cache-hot bytes."""
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

    async def bulk_while(self, run: Callable[[], bool], stop: Callable[[], bool],
                         paused: Callable[[bool], None], tally: dict[str, float]) -> None:
        """Pull bulk back to back while `run()` until `stop()`; `paused(True)` once it holds still;
        bytes and seconds pulled add to `tally`."""
        ops = bulk_ops(self.size)
        nbytes = sum(o.length for o in ops)
        while not stop():
            if not run():
                paused(True)
                await asyncio.sleep(0.001)
                continue
            paused(False)
            t = time.perf_counter()
            await self.peer.read(ops, TrafficClass.BULK, grant=self.grant)
            tally["s"] += time.perf_counter() - t
            tally["bytes"] += nbytes

    async def pull_list(self, pulls: list[list[Op]], samples: int) -> list[float]:
        """Seconds of `samples` latency-class pulls (1 ms apart), cycling through `pulls`."""
        ts = []
        for i in range(samples):
            t = time.perf_counter()
            await self.peer.read(pulls[i % len(pulls)], TrafficClass.LATENCY, grant=self.grant)
            ts.append(time.perf_counter() - t)
            await asyncio.sleep(0.001)
        return ts


def bulk_main(backend: str, desc: bytes, size: int, conn: Connection, run: Any, idle: Any) -> None:
    _run(_bulk(backend, desc, size, conn, run, idle))


async def _bulk(backend: str, desc: bytes, size: int, conn: Connection, run: Any, idle: Any) -> None:
    async with Initiator(backend, desc, size, "bulk") as ini:
        conn.send_bytes(b"ready")
        tally = {"bytes": 0.0, "s": 0.0}
        await ini.bulk_while(run.is_set, conn.poll, lambda p: idle.set() if p else idle.clear(), tally)
        conn.recv_bytes()
        conn.send_bytes(b"done")


# -- main: the measuring initiator -------------------------------------------------------

@dataclass
class Result:
    backend: str
    single: IsolationFigures
    layer: IsolationFigures
    bulk_alone: float  # GB/s, no latency work anywhere
    bulk_busy: float  # GB/s of the same-link bulk while latency pulls run


async def _measure(backend: str, desc: bytes, size: int, block: int, nblocks: int,
                   samples: int, ctx: Any) -> Result:
    async with Initiator(backend, desc, size, "pe") as ini:
        one, layer = rotating(block, 1), rotating(block, nblocks)
        await ini.pull_list(layer, 5)  # warm-up: maps, sockets, buffers
        same = {"run": False, "stop": False, "paused": True}
        tally = {"bytes": 0.0, "s": 0.0}
        task = asyncio.ensure_future(ini.bulk_while(lambda: same["run"], lambda: same["stop"],
                                                    lambda p: same.__setitem__("paused", p), tally))
        run_other, other_idle = ctx.Event(), ctx.Event()
        other_idle.set()
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=bulk_main, args=(backend, desc, size, child, run_other, other_idle), daemon=True)
        proc.start()
        parent.recv_bytes()

        async def phase(name: str) -> None:
            same["run"] = name == "same_link"
            if name == "other_tm":
                run_other.set()
            else:
                run_other.clear()
            while not ((name == "same_link" or same["paused"]) and (name == "other_tm" or other_idle.is_set())):
                await asyncio.sleep(0.001)
            if name != "idle":
                await asyncio.sleep(0.02)  # bulk in full flow before the first sample

        try:
            await phase("same_link")
            await asyncio.sleep(1.0)
            await phase("idle")
            alone = tally["bytes"] / max(tally["s"], 1e-9) / 1e9
            tally.update(bytes=0.0, s=0.0)
            per = {name: ([], []) for name in ("idle", "same_link", "other_tm")}
            k = max(1, samples // WINDOWS)
            for _ in range(WINDOWS):
                for name, (ones, layers) in per.items():
                    await phase(name)
                    ones.extend(await ini.pull_list(one, k))
                    layers.extend(await ini.pull_list(layer, k))
            await phase("idle")
            busy = tally["bytes"] / max(tally["s"], 1e-9) / 1e9
        finally:
            same["stop"] = True
            await task
            parent.send_bytes(b"stop")
            parent.recv_bytes()
            proc.join(10)
    med = {name: (statistics.median(a), statistics.median(b)) for name, (a, b) in per.items()}
    return Result(backend, IsolationFigures(*(med[n][0] for n in per)), IsolationFigures(*(med[n][1] for n in per)),
                  alone, busy)


def isolation(backend: str, size: int, block: int, nblocks: int, samples: int, rounds: int = 3) -> Result:
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
    def figs(get: Any) -> IsolationFigures:
        return IsolationFigures(*(statistics.median(getattr(get(r), f) for r in runs)
                                  for f in ("idle", "same_link", "other_tm")))

    return Result(runs[0].backend, figs(lambda r: r.single), figs(lambda r: r.layer),
                  statistics.median(r.bulk_alone for r in runs), statistics.median(r.bulk_busy for r in runs))


def report(r: Result, block: int, nblocks: int) -> list[str]:
    def line(what: str, f: IsolationFigures) -> str:
        pct = lambda x: f"{(x / f.idle - 1) * 100:+.0f}%"  # noqa: E731
        return (f"  {what:<22} idle {f.idle * 1e6:6.0f} us | bulk same link {f.same_link * 1e6:6.0f} us "
                f"{pct(f.same_link):>6} | bulk other TM {f.other_tm * 1e6:6.0f} us {pct(f.other_tm):>6}")

    return [
        f"latency class over {r.backend} (target TM in its own process), median pull time (median of rounds):",
        line(f"one {block >> 10} KiB block", r.single),
        line(f"layer of {nblocks} blocks", r.layer),
        f"  bulk pull throughput: alone {r.bulk_alone:.2f} GB/s | while latency pulls run {r.bulk_busy:.2f} GB/s",
    ]
