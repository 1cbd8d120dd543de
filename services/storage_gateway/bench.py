"""Gateway read throughput (no rate cap) against the disk's raw read throughput (dd).

    python -m services.storage_gateway.bench [--dir PATH] [--mib 256] [--threads 4]

Writes ``--mib`` of Full Blocks (a Llama-8B-like layout: 32 layers x 8 KV heads x
128 dims, bf16, 64 tokens = 8 MiB per block) through a ``DirectoryStore`` and a raw
file of the same size, then times, for each:

- warm: page cache hot (best of 3) — what a hot working set costs (checksum included);
- cold: page cache dropped for those files with fsync + posix_fadvise(DONTNEED)
  (best effort without root; ``drop_caches`` is not used), and dd with
  ``iflag=direct`` (O_DIRECT, no page cache at all) where the file system allows it.

The gateway reads with ``GatewayCore.read_blocks`` into one pre-faulted buffer, so
its figure includes header parsing, checksum verification and the thread pool.

Owns: the bench only; it is not imported by the service.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from services.storage_gateway.engine import GatewayCore
from services.storage_gateway.store import DirectoryStore
from shared.kv.hashing import ModelFingerprint, block_hashes
from shared.kv.layout import KVLayout

LAYOUT = KVLayout(n_layers=32, n_kv_heads=8, head_dim=128, dtype="bfloat16", block_size=64)
_DD_SECONDS = re.compile(r"copied, ([0-9.]+) s")


def _drop_cache(path: str) -> None:
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
    with open(raw, "wb") as f:
        for _ in range(n_blocks):
            f.write(payload.tobytes())
            f.write(bytes(4096))  # same bytes as the block files
    return store, keys, raw


def _gateway_read(core: GatewayCore, keys: list[bytes], buf: np.ndarray) -> float:
    offsets = [i * LAYOUT.payload_bytes for i in range(len(keys))]
    start = time.perf_counter()
    result = asyncio.run(core.read_blocks(keys, memoryview(buf), offsets))
    elapsed = time.perf_counter() - start
    if result.blocks != len(keys):
        raise RuntimeError(f"bench read stopped early: {result}")
    return result.bytes / elapsed


def _dd_read(path: str, direct: bool) -> float | None:
    cmd = ["dd", f"if={path}", "of=/dev/null", "bs=4M"] + (["iflag=direct"] if direct else [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    match = _DD_SECONDS.search(out.stderr)
    if out.returncode != 0 or match is None:
        return None  # e.g. O_DIRECT unsupported on this file system
    return os.path.getsize(path) / float(match.group(1))


def _memcpy(dst: np.ndarray) -> float:
    """DRAM copy ceiling: dd reads into one small reused buffer, the gateway into a
    ``--mib``-sized one, so warm reads are bounded by this, not by the disk."""
    src = np.ones_like(dst)
    start = time.perf_counter()
    np.copyto(dst, src)
    return dst.nbytes / (time.perf_counter() - start)


def _best(fn: Callable[[], float | None], runs: int) -> float | None:
    results = [r for r in (fn() for _ in range(runs)) if r is not None]
    return max(results) if results else None


def _fmt(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate / 1e9:7.2f} GB/s"


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None else f"{a / b:5.2f}x"


def run(root: Path, mib: int, threads: int) -> None:
    n_blocks = max(1, mib * 2**20 // LAYOUT.payload_bytes)
    store, keys, raw = _setup(root, n_blocks)
    files = [store.path_for(k) for k in keys]
    core = GatewayCore(store, io_threads=threads)
    buf = np.ones(n_blocks * LAYOUT.payload_bytes, np.uint8)  # pre-faulted

    def cold_gateway() -> float:
        for path in files:
            _drop_cache(path)
        return _gateway_read(core, keys, buf)

    def cold_dd() -> float | None:
        _drop_cache(raw)
        return _dd_read(raw, direct=False)

    gw_warm = _best(lambda: _gateway_read(core, keys, buf), 3)
    dd_warm = _best(lambda: _dd_read(raw, direct=False), 3)
    gw_cold, dd_cold, dd_direct = cold_gateway(), cold_dd(), _dd_read(raw, direct=True)
    copy = _best(lambda: _memcpy(buf), 3)
    core.close()
    total = n_blocks * LAYOUT.payload_bytes
    print(f"storage-gateway read bench: {n_blocks} blocks x {LAYOUT.payload_bytes >> 20} MiB "
          f"= {total / 2**20:.0f} MiB, {threads} I/O threads, dir {root}")  # fmt: skip
    print(f"  warm (page cache): gateway {_fmt(gw_warm)}  dd {_fmt(dd_warm)}  "
          f"ratio {_ratio(gw_warm, dd_warm)}")  # fmt: skip
    print(f"  memcpy into a buffer of that size: {_fmt(copy)}  "
          f"gateway warm / memcpy {_ratio(gw_warm, copy)}")  # fmt: skip
    print(f"  cold (fadvise DONTNEED): gateway {_fmt(gw_cold)}  dd {_fmt(dd_cold)}  "
          f"ratio {_ratio(gw_cold, dd_cold)}")  # fmt: skip
    print(f"  dd O_DIRECT (no cache): {_fmt(dd_direct)}  "
          f"gateway cold / dd O_DIRECT {_ratio(gw_cold, dd_direct)}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="directory to test (default: a temp dir)")
    parser.add_argument("--mib", type=int, default=256, help="data size in MiB")
    parser.add_argument("--threads", type=int, default=4, help="gateway I/O threads")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="sg-bench-") as tmp:
        run(Path(tmp), args.mib, args.threads)


if __name__ == "__main__":
    main()
