"""The host's floor for latency under bulk: the same pulls with no transport code, idle vs beside a bulk stream."""

from __future__ import annotations

import multiprocessing as mp
import socket
import statistics
import time
from dataclasses import dataclass

import numpy as np

BULK_CHUNK = 1 << 20  # one send of the bulk stream
WINDOWS = 6  # idle / busy windows per round


@dataclass(frozen=True)
class Floor:
    idle: float  # median seconds
    busy: float

    @property
    def over(self) -> float:
        return self.busy / self.idle - 1


def _serve_pulls(sock: socket.socket, size: int) -> None:
    conn, _ = sock.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = bytes(size)
    while True:
        req = conn.recv(8)
        if len(req) < 8:
            return
        n = int.from_bytes(req, "little")
        conn.sendall(memoryview(payload)[:n])


def _bulk_send(sock: socket.socket, on) -> None:
    conn, _ = sock.accept()
    chunk = bytes(BULK_CHUNK)
    while True:
        on.wait()
        conn.sendall(chunk)


def _bulk_recv(port: int) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    buf = bytearray(BULK_CHUNK)
    view = memoryview(buf)
    while s.recv_into(view):
        pass


def _listener() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, s.getsockname()[1]


def floors(sizes: dict[str, int], samples: int = 60, rounds: int = 3) -> dict[str, dict[str, Floor]]:
    ctx = mp.get_context("fork")
    big = max(sizes.values())
    pull_sock, pull_port = _listener()
    bulk_sock, bulk_port = _listener()
    on = ctx.Event()
    procs = [ctx.Process(target=_serve_pulls, args=(pull_sock, big), daemon=True),
             ctx.Process(target=_bulk_send, args=(bulk_sock, on), daemon=True),
             ctx.Process(target=_bulk_recv, args=(bulk_port,), daemon=True)]
    for p in procs:
        p.start()
    client = socket.create_connection(("127.0.0.1", pull_port))
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    src, dst = np.ones(big, np.uint8), np.zeros(big, np.uint8)
    rbuf = memoryview(bytearray(big))

    def memcpy(n: int) -> float:
        t = time.perf_counter()
        np.copyto(dst[:n], src[:n])
        return time.perf_counter() - t

    def pull(n: int) -> float:
        t = time.perf_counter()
        client.sendall(n.to_bytes(8, "little"))
        got = 0
        while got < n:
            got += client.recv_into(rbuf[got:n])
        return time.perf_counter() - t

    kinds = {"memcpy": memcpy, "socket": pull}
    per_round: dict[tuple[str, str, bool], list[float]] = {}
    try:
        for _ in range(rounds):
            got: dict[tuple[str, str, bool], list[float]] = {}
            for w in range(WINDOWS):
                busy = w % 2 == 1
                if busy:
                    on.set()
                    time.sleep(0.02)  # the stream under way before the first pull
                for kind, fn in kinds.items():
                    for name, n in sizes.items():
                        xs = got.setdefault((kind, name, busy), [])
                        for _ in range(max(1, samples // (WINDOWS // 2))):
                            xs.append(fn(n))
                on.clear()
                time.sleep(0.02)  # the stream drained (the sender blocks in wait)
            for key, xs in got.items():
                per_round.setdefault(key, []).append(statistics.median(xs))
    finally:
        client.close()
        for p in procs:
            p.kill()
            p.join()
        pull_sock.close()
        bulk_sock.close()
    med = lambda key: statistics.median(per_round[key])  # noqa: E731
    return {kind: {name: Floor(med((kind, name, False)), med((kind, name, True))) for name in sizes}
            for kind in kinds}


def floor_lines(f: dict[str, dict[str, Floor]]) -> list[str]:
    out = ["host floor (no transport code; bulk streamed between two other processes), median time:"]
    for kind, rows in f.items():
        for name, fl in rows.items():
            out.append(f"  {kind:6s} {name:18s} idle {fl.idle * 1e6:7.0f} us | beside bulk {fl.busy * 1e6:7.0f} us"
                       f"  {fl.over * 100:+4.0f}%")
    return out
