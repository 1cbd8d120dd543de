"""`python -m shared.transport.bench`: data-plane figures against their baselines.

Owns the benchmark only. Prints, for 64 MiB moved in layer-block-sized pieces (96 KiB):
tcp backend vs a raw loopback socket, shm backend vs an in-process memcpy; then, per
backend (tcp, shm), the latency-class pull time of one layer block and of one layer of
a batch of hit blocks, idle vs under saturating bulk, with each TM in its own process
(bench_isolation.py), and bulk throughput alone vs beside latency work. Runs on uvloop,
like the services.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time

import numpy as np

from . import Op, ShmRegion, TrafficClass, create_endpoint, new_name
from .bench_isolation import isolation, report

MIB = 1 << 20
BLOCK = 96 << 10


def raw_socket_seconds(total: int, block: int) -> float:
    """Blocking loopback socket: sendall per block, receiver recv_into one buffer."""
    lsock = socket.create_server(("127.0.0.1", 0))
    src, dst = memoryview(os.urandom(total)), memoryview(bytearray(total))

    def recv() -> None:
        conn, _ = lsock.accept()
        got = 0
        while got < total:
            got += conn.recv_into(dst[got:])
        conn.sendall(b"k")
        conn.close()

    th = threading.Thread(target=recv)
    th.start()
    s = socket.create_connection(lsock.getsockname())
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t = time.perf_counter()
    for off in range(0, total, block):
        s.sendall(src[off : off + block])
    s.recv(1)
    dt = time.perf_counter() - t
    th.join()
    s.close()
    lsock.close()
    return dt


def memcpy_seconds(total: int, block: int) -> float:
    a, b = ShmRegion.create(new_name("bm"), total), ShmRegion.create(new_name("bm"), total)
    try:
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for off in range(0, total, block):
                b.buf[off : off + block] = a.buf[off : off + block]
            best = min(best, time.perf_counter() - t)
        return best
    finally:
        for r in (a, b):
            r.close()
            r.unlink()


class Rig:
    """Two endpoints of one backend with `total`-byte shm regions, connected."""

    def __init__(self, backend: str, total: int) -> None:
        self.backend, self.total = backend, total

    async def __aenter__(self) -> Rig:
        self.a = create_endpoint(self.backend, node="pe")
        self.b = create_endpoint(self.backend, node="de")
        self.ra, self.rb = ShmRegion.create(new_name("bm"), self.total), ShmRegion.create(new_name("bm"), self.total)
        self.ra.buf[:] = os.urandom(self.total)
        await self.a.start()
        await self.b.start()
        self.a.register("kv", self.ra.buf, shm_name=self.ra.name)
        self.b.register("buf", self.rb.buf, shm_name=self.rb.name)
        self.peer = await self.a.connect(self.b.desc())
        self.grant = self.b.grant("buf")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.peer.close()
        await self.a.close()
        await self.b.close()
        for r in (self.ra, self.rb):
            r.close()
            r.unlink()

    def ops(self, block: int, n: int | None = None) -> list[Op]:
        count = self.total // block if n is None else n
        return [Op("kv", i * block, "buf", i * block, block) for i in range(count)]


async def backend_seconds(backend: str, total: int, block: int) -> float:
    async with Rig(backend, total) as rig:
        ops, best = rig.ops(block), float("inf")
        for _ in range(3):
            t = time.perf_counter()
            await rig.peer.write(ops, TrafficClass.BULK, grant=rig.grant)
            best = min(best, time.perf_counter() - t)
        assert rig.ra.buf[: len(ops) * block] == rig.rb.buf[: len(ops) * block]
        return best


async def _throughput(total: int, block: int) -> dict:
    raw = raw_socket_seconds(total, block)
    tcp = await backend_seconds("tcp", total, block)
    mem = memcpy_seconds(total, block)
    shm = await backend_seconds("shm", total, block)
    gb = total / 1e9
    return {"payload_mib": total // MIB, "piece_kib": block // 1024,
            "tcp_gb_s": gb / tcp, "raw_socket_gb_s": gb / raw, "tcp_over_raw_time": tcp / raw,
            "shm_gb_s": gb / shm, "memcpy_gb_s": gb / mem, "shm_over_memcpy_time": shm / mem}


def throughput_lines(t: dict) -> list[str]:
    return [f"payload: {t['payload_mib']} MiB in {t['piece_kib']} KiB pieces",
            f"tcp  backend {t['tcp_gb_s']:6.2f} GB/s | raw socket {t['raw_socket_gb_s']:6.2f} GB/s "
            f"| tcp/raw time ratio {t['tcp_over_raw_time']:.2f}x",
            f"shm  backend {t['shm_gb_s']:6.2f} GB/s | memcpy     {t['memcpy_gb_s']:6.2f} GB/s "
            f"| shm/memcpy time ratio {t['shm_over_memcpy_time']:.2f}x"]


def figures(mib: int = 64, block: int = BLOCK, layer_blocks: int = 16, samples: int = 150, rounds: int = 3,
            backends: tuple[str, ...] = ("tcp", "shm"), with_throughput: bool = True) -> dict:
    """Every figure of this bench as one JSON-able dict (`dualpath bench --data-plane` reports it)."""
    import uvloop

    out: dict = {}
    if with_throughput:
        print(f"throughput: {mib} MiB over tcp, a raw socket, shm and memcpy ...", file=sys.stderr, flush=True)
        out["throughput"] = uvloop.run(_throughput(mib * MIB, block))
    out["isolation"] = {}
    for backend in backends:
        print(f"isolation over {backend}: {rounds} idle/busy rounds ...", file=sys.stderr, flush=True)
        r = isolation(backend, 64 * MIB, block, layer_blocks, samples, rounds)
        out["isolation"][backend] = {
            "piece_kib": block // 1024, "layer_blocks": layer_blocks,
            "one_block_s": vars(r.single), "one_layer_s": vars(r.layer),
            "bulk_alone_gb_s": r.bulk_alone, "bulk_beside_latency_gb_s": r.bulk_busy,
            "lines": report(r, block, layer_blocks)}
    return out


def lines(fig: dict) -> list[str]:
    out = throughput_lines(fig["throughput"]) if "throughput" in fig else []
    for iso in fig["isolation"].values():
        out += iso["lines"]
    return out


def main() -> None:
    from dualpath.cli import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--mib", type=int, default=64, help="throughput: MiB moved per backend")
    ap.add_argument("--block-kib", type=int, default=96, help="piece size in KiB (one layer block)")
    ap.add_argument("--samples", type=int, default=150, help="isolation: pulls timed per round")
    ap.add_argument("--layer-blocks", type=int, default=16, help="hit blocks pulled per layer")
    ap.add_argument("--backends", default="tcp,shm", help="comma-separated backends for the isolation figures")
    ap.add_argument("--rounds", type=int, default=3, help="isolation: idle/busy rounds; figures are medians")
    ap.add_argument("--no-throughput", action="store_true", help="skip the throughput figures")
    args = ap.parse_args()
    np.random.seed(0)
    fig = figures(args.mib, args.block_kib << 10, args.layer_blocks, args.samples, args.rounds,
                  tuple(args.backends.split(",")), not args.no_throughput)
    print("\n".join(lines(fig)))


if __name__ == "__main__":
    main()
