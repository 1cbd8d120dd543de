"""Gateway read throughput (no rate cap) against ``dd`` of the same bytes, warm and cold.

    python -m services.storage_gateway.bench [--dir PATH] [--mib 256] [--threads 4] [--rounds 5]

A figure is the best round, the median in brackets. Buffers are page-aligned shared memory, as in
the mesh. Not imported by the service."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import resource
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from services.storage_gateway.config import StorageGatewayConfig
from services.storage_gateway.engine import GatewayCore
from services.storage_gateway.hash_lanes import HashLanes, shared_lanes
from services.storage_gateway.store import DirectoryStore
from shared.kv.full_block import HEADER_SIZE
from shared.kv.hashing import ModelFingerprint, block_hashes
from shared.kv.layout import KVLayout
from shared.transport.shm_region import ShmRegion, new_name

LAYOUT = KVLayout(n_layers=32, n_kv_heads=8, head_dim=128, dtype="bfloat16", block_size=64)
FILE_BYTES = HEADER_SIZE + LAYOUT.payload_bytes
_DD_SECONDS = re.compile(r"copied, ([0-9.e+-]+) s")


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _setup(root: Path, n_blocks: int) -> tuple[DirectoryStore, list[bytes], str]:
    fp = ModelFingerprint.from_layout("bench-model", LAYOUT).digest()
    store = DirectoryStore(root / "store", fp, LAYOUT)
    tokens = np.arange(n_blocks * LAYOUT.block_size)
    keys = block_hashes(tokens, LAYOUT.block_size, fp)
    payload = np.random.default_rng(0).integers(0, 256, LAYOUT.payload_bytes, dtype=np.uint8)
    for key in keys:
        store.write(key, memoryview(payload))
    raw = str(root / "raw.bin")
    with open(raw, "wb") as out:
        for key in keys:
            out.write(Path(store.path_for(key)).read_bytes())
    return store, keys, raw


def _timed(fn: Callable[[], object], nbytes: int) -> float:
    start = time.perf_counter()
    fn()
    return nbytes / (time.perf_counter() - start)


def _gateway(core: GatewayCore, keys: list[bytes], buf: np.ndarray, per_request: int) -> float:
    """Rate of reading ``keys`` in requests of ``per_request`` blocks; slots wrap around ``buf``."""
    slots = len(buf) // LAYOUT.payload_bytes
    view = memoryview(buf)

    async def read_all() -> float:
        start = time.perf_counter()
        for i in range(0, len(keys), per_request):
            batch = keys[i : i + per_request]
            offs = [(i + j) % slots * LAYOUT.payload_bytes for j in range(len(batch))]
            res = await core.read_blocks(batch, view, offs)
            if res.blocks != len(batch):
                raise RuntimeError(f"bench read stopped early: {res}")
        return len(keys) * FILE_BYTES / (time.perf_counter() - start)

    return asyncio.run(read_all())


def _plain_read(files: list[str], buf: np.ndarray) -> float:
    """One thread, ``preadv`` of whole files into their slots: no header, no checksum."""
    view = memoryview(buf)
    header = bytearray(HEADER_SIZE)

    def read() -> None:
        for i, path in enumerate(files):
            with open(path, "rb", buffering=0) as f:
                os.preadv(f.fileno(), [header, view[i * LAYOUT.payload_bytes : (i + 1) * LAYOUT.payload_bytes]], 0)

    return _timed(read, len(files) * FILE_BYTES)


def _dd(path: str, direct: bool = False) -> float | None:
    cmd = ["dd", f"if={path}", "of=/dev/null", "bs=4M"] + (["iflag=direct"] if direct else [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    match = _DD_SECONDS.search(out.stderr)
    if out.returncode != 0 or match is None:
        return None  # e.g. O_DIRECT unsupported on this file system
    return os.path.getsize(path) / float(match.group(1))


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _memcpy(dst: np.ndarray) -> float:
    src = np.ones_like(dst)
    return _timed(lambda: np.copyto(dst, src), dst.nbytes)


class Figures:
    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}  # CPU seconds per GB, for the lines measured with `bill`

    def add(self, name: str, rate: float | None) -> None:
        if rate is not None:
            self.samples.setdefault(name, []).append(rate)

    def bill(self, name: str, measure: Callable[[], float | None], nbytes: int) -> None:
        """`add(name, measure())`, also keeping its CPU per GB (this process's and its children's)."""
        t0, c0 = time.process_time(), _children_cpu()
        rate = measure()
        used = time.process_time() - t0 + _children_cpu() - c0
        self.add(name, rate)
        if rate is not None:
            self.cpu.setdefault(name, []).append(used / (nbytes / 1e9))

    def cpu_text(self, name: str, base: str) -> str:
        mine, theirs = statistics.median(self.cpu[name]), statistics.median(self.cpu[base])
        return f"  {name:44s} {mine * 1e3:7.1f} CPU ms/GB ({mine / max(theirs, 1e-9):.2f}x dd's)"

    def best(self, name: str) -> float | None:
        return max(self.samples[name]) if name in self.samples else None

    def text(self, name: str) -> str:
        if name not in self.samples:
            return f"{name:44s}     n/a"
        rates = self.samples[name]
        return (f"{name:44s} {max(rates) / 1e9:7.2f} GB/s "
                f"[{statistics.median(rates) / 1e9:.2f}]")  # fmt: skip

    def ratio(self, a: str, b: str) -> str:
        x, y = self.best(a), self.best(b)
        if x is None or y is None:
            return "n/a"
        med = statistics.median(self.samples[a]) / statistics.median(self.samples[b])
        pairs = list(zip(self.samples[a], self.samples[b]))
        paired = f" (per round {statistics.median(p / q for p, q in pairs):.2f}x)" if len(
            self.samples[a]) == len(self.samples[b]) else ""  # fmt: skip
        return f"{x / y:.2f}x [{med:.2f}x]{paired}"


def _hashing(store: DirectoryStore, lanes: HashLanes | None, fn: Callable[[], float]) -> float:
    store.reader.lanes = lanes  # the far half on a lane, or (None) all on the reading thread
    try:
        return fn()
    finally:
        store.reader.lanes = shared_lanes()


def measure(root: Path, mib: int, threads: int, rounds: int) -> tuple[Figures, int]:
    n_blocks = max(1, mib * 2**20 // LAYOUT.payload_bytes)
    store, keys, raw = _setup(root, n_blocks)
    files = [store.path_for(k) for k in keys]
    inline = int(StorageGatewayConfig().inline_read_mib * 2**20)  # as the service runs
    core = GatewayCore(store, io_threads=threads, inline_bytes=inline)
    threaded = GatewayCore(store, io_threads=threads)  # every read handed to a thread
    regions = [ShmRegion.create(new_name("sg-bench"), n) for n in (n_blocks * LAYOUT.payload_bytes,
                                                                    LAYOUT.payload_bytes)]
    big, slot = (np.frombuffer(r.buf, np.uint8) for r in regions)
    big[:] = 1  # pre-faulted
    slot[:] = 1
    heap = np.ones(big.nbytes + 64, np.uint8)  # malloc'd, then 16 B past a cache line on purpose
    off = next(i for i in range(64) if (heap.ctypes.data + i) % 64 == 16)
    unaligned = heap[off : off + big.nbytes]
    figs = Figures()
    lanes = store.reader.lanes  # split reads (hash_lanes.py), as the service runs

    try:
        for r in range(rounds):
            _dd(raw)  # the previous round's cold reads left these uncached: warm them again
            _plain_read(files, big)
            nbytes = n_blocks * FILE_BYTES
            figs.bill("warm  dd bs=4M", lambda: _dd(raw), nbytes)
            one_block = [("warm  gateway, 1 block/request, reused slot", core, lanes),
                         ("warm  same, hashed on the reading thread", core, None),
                         ("warm  same, every read on a thread", threaded, lanes)]
            for name, c, how in one_block[:: 1 if r % 2 == 0 else -1]:  # each goes first every other round
                figs.bill(name, lambda c=c, how=how: _hashing(store, how, lambda: _gateway(c, keys, slot, 1)),
                          nbytes)
            figs.bill("warm  gateway, 1 request, big buffer", lambda: _gateway(core, keys, big, n_blocks), nbytes)
            figs.bill("warm  plain preadv into big buffer, 1 thread", lambda: _plain_read(files, big), nbytes)
            figs.add("warm  preadv into big buffer +16 B, 1 thread", _plain_read(files, unaligned))
            figs.add("warm  memcpy into big buffer", _memcpy(big))
            drop_cache(raw)
            figs.add("cold  dd bs=4M", _dd(raw))
            for path in files:
                drop_cache(path)
            figs.add("cold  gateway, 1 request, big buffer", _gateway(core, keys, big, n_blocks))
        figs.add("cold  dd O_DIRECT (no page cache)", _dd(raw, direct=True))
    finally:
        core.close()
        threaded.close()
        del big, slot, unaligned, heap
        for region in regions:
            region.close()
            region.unlink()
    return figs, n_blocks


def report(figs: Figures, n_blocks: int, threads: int, rounds: int, where: Path) -> str:
    lines = [
        f"storage-gateway read bench: {n_blocks} blocks x {LAYOUT.payload_bytes >> 20} MiB, "
        f"{threads} I/O threads, {rounds} rounds, dir {where} (best [median])",
        *(figs.text(name) for name in figs.samples),
        "ratios (best [median]):",
        "  warm, reused buffer (like for like): gateway / dd "
        + figs.ratio("warm  gateway, 1 block/request, reused slot", "warm  dd bs=4M"),
        "  warm, reused buffer, hashed on the reading thread: gateway / dd "
        + figs.ratio("warm  same, hashed on the reading thread", "warm  dd bs=4M"),
        "  warm, reused buffer, every read on a thread: gateway / dd "
        + figs.ratio("warm  same, every read on a thread", "warm  dd bs=4M"),
        "  warm, big buffer: gateway / dd "
        + figs.ratio("warm  gateway, 1 request, big buffer", "warm  dd bs=4M")
        + ", gateway / plain preadv "
        + figs.ratio("warm  gateway, 1 request, big buffer",
                     "warm  plain preadv into big buffer, 1 thread"),  # fmt: skip
        "  warm, big buffer: gateway / memcpy into the same buffer (its DRAM bound: dd reuses a 4 MiB "
        "buffer that stays in cache) "
        + figs.ratio("warm  gateway, 1 request, big buffer", "warm  memcpy into big buffer"),
        "  warm, plain preadv into a buffer 16 B off a cache line / aligned "
        + figs.ratio("warm  preadv into big buffer +16 B, 1 thread",
                     "warm  plain preadv into big buffer, 1 thread"),  # fmt: skip
        "  cold: gateway / dd "
        + figs.ratio("cold  gateway, 1 request, big buffer", "cold  dd bs=4M"),
        "warm reads billed in CPU (medians; checksums, header checks and the thread hops included):",
        *(figs.cpu_text(name, "warm  dd bs=4M") for name in figs.cpu),
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="directory to test (default: a temp dir)")
    parser.add_argument("--mib", type=int, default=256, help="data size in MiB")
    parser.add_argument("--threads", type=int, default=4, help="gateway I/O threads")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("mib", "threads", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="sg-bench-") as tmp:
        figs, n_blocks = measure(Path(tmp), args.mib, args.threads, args.rounds)
        print(report(figs, n_blocks, args.threads, args.rounds, Path(tmp)))


if __name__ == "__main__":  # one benchmark at a time; its load and CPU said at the end
    from shared.benchrun import alone

    raise SystemExit(alone("services.storage_gateway.bench", lambda conditions: main()))
