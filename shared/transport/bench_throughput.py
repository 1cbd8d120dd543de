"""Data-plane throughput against its baselines, side by side, round after round."""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time

import numpy as np

from . import Op, ShmRegion, TrafficClass, create_endpoint, new_name

MIB = 1 << 20
LAYOUTS = ("contiguous", "scattered")


def slots(n: int, layout: str) -> list[int]:
    """Destination slot of each of `n` pieces: identity, or a permutation with no i -> i+1 run."""
    if layout == "contiguous":
        return list(range(n))
    perm = [int(x) for x in np.random.default_rng(0).permutation(n)]
    for i in range(1, n):  # break the rare run a random permutation has
        if perm[i] == perm[i - 1] + 1:
            j = (i + 1) % n
            perm[i], perm[j] = perm[j], perm[i]
    return perm


def shm_pair(total: int) -> tuple[ShmRegion, ShmRegion]:
    """A source segment of random bytes and a zeroed destination: page-aligned, like the backends'."""
    a, b = ShmRegion.create(new_name("bm"), total), ShmRegion.create(new_name("bm"), total)
    a.buf[:] = os.urandom(total)
    b.buf[:] = bytes(total)
    return a, b


def drop_pair(regions: tuple[ShmRegion, ShmRegion]) -> None:
    for r in regions:
        r.close()
        r.unlink()


class RawSocket:
    def __init__(self, total: int) -> None:
        self.total = total
        self.regions = shm_pair(total)
        self.src, self.dst = self.regions[0].buf, self.regions[1].buf
        lsock = socket.create_server(("127.0.0.1", 0))
        self.tx = socket.create_connection(lsock.getsockname())
        self.tx.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rx, _ = lsock.accept()
        lsock.close()
        self._go = threading.Semaphore(0)
        self._thread = threading.Thread(target=self._recv, daemon=True)
        self._thread.start()

    def _recv(self) -> None:
        while True:
            self._go.acquire()
            got = 0
            while got < self.total:
                n = self.rx.recv_into(self.dst[got:])
                if not n:
                    return
                got += n
            self.rx.sendall(b"k")

    def seconds(self, block: int) -> float:
        self._go.release()
        t = time.perf_counter()
        for off in range(0, self.total, block):
            self.tx.sendall(self.src[off : off + block])
        self.tx.recv(1)
        return time.perf_counter() - t

    def close(self) -> None:
        self.tx.close()
        self._go.release()
        self._thread.join(5)
        self.rx.close()
        del self.src, self.dst
        drop_pair(self.regions)


class Memcpy:
    def __init__(self, total: int) -> None:
        self.a, self.b = shm_pair(total)

    def seconds(self, block: int, dst: list[int]) -> float:
        a, b = self.a.buf, self.b.buf
        t = time.perf_counter()
        for i, j in enumerate(dst):
            b[j * block : (j + 1) * block] = a[i * block : (i + 1) * block]
        return time.perf_counter() - t

    def close(self) -> None:
        drop_pair((self.a, self.b))


class Rig:
    def __init__(self, backend: str, total: int) -> None:
        self.backend, self.total = backend, total

    async def __aenter__(self) -> Rig:
        self.a = create_endpoint(self.backend, node="pe")
        self.b = create_endpoint(self.backend, node="de")
        self.ra, self.rb = shm_pair(self.total)
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
        drop_pair((self.ra, self.rb))

    def ops(self, block: int, dst: list[int]) -> list[Op]:
        return [Op("kv", i * block, "buf", j * block, block) for i, j in enumerate(dst)]

    async def seconds(self, ops: list[Op]) -> float:
        t = time.perf_counter()
        await self.peer.write(ops, TrafficClass.BULK, grant=self.grant)
        return time.perf_counter() - t

    def check(self, block: int, dst: list[int]) -> None:
        for i, j in enumerate(dst):
            if self.ra.buf[i * block : (i + 1) * block] != self.rb.buf[j * block : (j + 1) * block]:
                raise AssertionError(f"{self.backend}: piece {i} did not land at slot {j}")


class Tally:
    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def note(self, key: str, wall: float, cpu0: float) -> None:
        self.times.setdefault(key, []).append(wall)
        self.cpu.setdefault(key, []).append(time.process_time() - cpu0)


def loadavg() -> list[float]:
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return []


async def throughput(total: int, block: int, rounds: int = 5) -> dict:
    """GB/s medians, and time ratios as medians of per-round ratios."""
    n = total // block
    total = n * block
    layouts = {lay: slots(n, lay) for lay in LAYOUTS}
    tally = Tally()
    times, cpu, note = tally.times, tally.cpu, tally.note
    load0 = loadavg()
    raw, mem = RawSocket(total), Memcpy(total)
    try:
        async with Rig("tcp", total) as tcp, Rig("shm", total) as shm:
            ops = {(r.backend, lay): r.ops(block, dst) for r in (tcp, shm) for lay, dst in layouts.items()}
            for key in ops:  # warm-up: connections, mappings, page tables
                await (tcp if key[0] == "tcp" else shm).seconds(ops[key])
            raw.seconds(block)
            for _ in range(max(1, rounds)):
                c = time.process_time()
                note("raw", raw.seconds(block), c)
                for lay, dst in layouts.items():
                    c = time.process_time()
                    note(f"tcp_{lay}", await tcp.seconds(ops[("tcp", lay)]), c)
                    c = time.process_time()
                    note(f"memcpy_{lay}", mem.seconds(block, dst), c)
                    c = time.process_time()
                    note(f"shm_{lay}", await shm.seconds(ops[("shm", lay)]), c)
            for r in (tcp, shm):
                r.check(block, layouts["scattered"])
    finally:
        raw.close()
        mem.close()
    gb = total / 1e9
    med = {k: statistics.median(v) for k, v in times.items()}

    def ratio(a: str, b: str, of: dict[str, list[float]] = times) -> float:
        return statistics.median(x / max(y, 1e-9) for x, y in zip(of[a], of[b]))

    out = {"payload_mib": total // MIB, "piece_kib": block // 1024, "rounds": len(times["raw"]),
           "loadavg_before": load0, "loadavg_after": loadavg(), "raw_socket_gb_s": gb / med["raw"]}
    for lay in LAYOUTS:  # one raw figure per round serves both layouts
        out[f"tcp_{lay}_gb_s"] = gb / med[f"tcp_{lay}"]
        out[f"tcp_{lay}_over_raw_time"] = ratio(f"tcp_{lay}", "raw")
        out[f"shm_{lay}_gb_s"] = gb / med[f"shm_{lay}"]
        out[f"memcpy_{lay}_gb_s"] = gb / med[f"memcpy_{lay}"]
        out[f"shm_{lay}_over_memcpy_time"] = ratio(f"shm_{lay}", f"memcpy_{lay}")
        out[f"tcp_{lay}_over_raw_cpu"] = ratio(f"tcp_{lay}", "raw", cpu)
        out[f"shm_{lay}_over_memcpy_cpu"] = ratio(f"shm_{lay}", f"memcpy_{lay}", cpu)
    out["cpu_ms"] = {k: 1e3 * statistics.median(v) for k, v in cpu.items()}
    return out


def throughput_lines(t: dict) -> list[str]:
    load = lambda xs: "/".join(f"{x:.2f}" for x in xs) or "?"  # noqa: E731
    out = [f"payload: {t['payload_mib']} MiB in {t['piece_kib']} KiB pieces, medians of {t['rounds']} rounds "
           f"(load average {load(t['loadavg_before'])} before, {load(t['loadavg_after'])} after)"]
    for lay in LAYOUTS:
        out += [f"  {lay:<10} tcp backend {t[f'tcp_{lay}_gb_s']:6.2f} GB/s | raw socket {t['raw_socket_gb_s']:6.2f} GB/s "
                f"| tcp/raw time ratio {t[f'tcp_{lay}_over_raw_time']:.2f}x "
                f"(= {1 / t[f'tcp_{lay}_over_raw_time']:.2f}x raw speed)",
                f"  {lay:<10} shm backend {t[f'shm_{lay}_gb_s']:6.2f} GB/s | memcpy     {t[f'memcpy_{lay}_gb_s']:6.2f} GB/s "
                f"| shm/memcpy time ratio {t[f'shm_{lay}_over_memcpy_time']:.2f}x "
                f"(= {1 / t[f'shm_{lay}_over_memcpy_time']:.2f}x memcpy speed)"]
    ms = t["cpu_ms"]
    out.append(f"  CPU of this process (all threads) per {t['payload_mib']} MiB, medians; load-robust where wall rates are not:")
    for lay in LAYOUTS:
        out.append(f"  {lay:<10} tcp {ms[f'tcp_{lay}']:6.1f} ms vs raw socket {ms['raw']:6.1f} ms "
                   f"({t[f'tcp_{lay}_over_raw_cpu']:.2f}x) | shm {ms[f'shm_{lay}']:6.1f} ms vs memcpy "
                   f"{ms[f'memcpy_{lay}']:6.1f} ms ({t[f'shm_{lay}_over_memcpy_cpu']:.2f}x)")
    return out
