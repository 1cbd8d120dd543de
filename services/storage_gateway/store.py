"""The directory store: Full Blocks as files under one root, which many gateways may share.

A write is atomic and skips existing blocks. A read fault deletes that exact file and is a miss,
never wrong output; eviction never corrupts a read in flight."""

from __future__ import annotations

import enum
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from services.storage_gateway.hash_lanes import shared_lanes
from services.storage_gateway.block_file import BlockReader, bytes_view, file_mtime, unlink_quiet, write_file
from services.storage_gateway.lru import LruIndex
from services.storage_gateway.retention import Level, Retention
from services.storage_gateway.scan import SUFFIX, scan_blocks
from services.storage_gateway.stats import StoreCounters, StoreStats
from services.storage_gateway.store_reads import StoreReads
from shared.kv.full_block import HEADER_SIZE, SizeMismatch
from shared.kv.layout import KVLayout


class WriteOutcome(enum.IntEnum):
    WRITTEN = 0
    EXISTS = 1  # already stored: skipped
    NO_SPACE = 2  # capacity full of pinned blocks: dropped


class DirectoryStore(StoreReads):
    """Full Blocks of one model under ``root``; thread-safe. Reads: ``StoreReads``."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        fingerprint: bytes,
        layout: KVLayout,
        capacity_bytes: int | None = None,
        *,
        fsync: bool = False,
        touch_interval_s: float = 5.0,
        stale_temp_s: float = 3600.0,
        clock: Callable[[], float] = time.time,  # wall clock: compared with mtimes
    ) -> None:
        self.fingerprint = fingerprint
        self.layout = layout
        self.capacity_bytes = capacity_bytes
        self.block_file_bytes = HEADER_SIZE + layout.payload_bytes
        self.dir = os.fspath(Path(root) / f"kv-{fingerprint.hex()}")
        self._fsync = fsync
        self._touch_interval_s = touch_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._index = LruIndex()
        self._retention = Retention()  # agents' hints: evicted first / last (retention.py)
        self._reserved = 0  # bytes of writes in flight (counted against capacity)
        self._counters = StoreCounters()
        self._made_dirs: set[str] = set()
        self._reader = BlockReader(fingerprint, layout, shared_lanes())
        os.makedirs(self.dir, exist_ok=True)
        self._scan(stale_temp_s)
        with self._lock:
            self._evict_locked(0)

    # ----- naming -----------------------------------------------------------
    def path_for(self, key: bytes) -> str:
        h = key.hex()
        return os.path.join(self.dir, h[0:2], h[2:4], h + SUFFIX)

    # ----- lookups (stat only) ----------------------------------------------
    def contains(self, key: bytes) -> bool:
        return os.path.exists(self.path_for(key))

    def longest_prefix(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` are stored (the prompt's hit, in blocks)."""
        n = next((i for i, key in enumerate(keys) if not self.contains(key)), len(keys))
        with self._lock:
            self._counters.hit_blocks += n
            self._counters.miss_blocks += len(keys) - n
        return n

    # ----- pins -------------------------------------------------------------
    def pin(self, keys: Sequence[bytes]) -> None:
        """Protect ``keys`` from this store's eviction until ``unpin``."""
        with self._lock:
            for key in keys:
                self._index.pin(key)

    def unpin(self, keys: Sequence[bytes]) -> None:
        with self._lock:
            for key in keys:
                self._index.unpin(key)

    @contextmanager
    def pinned(self, keys: Sequence[bytes]) -> Iterator[None]:
        self.pin(keys)
        try:
            yield
        finally:
            self.unpin(keys)

    # ----- retention (agents' hints) -----------------------------------------
    def retain(self, keys: Sequence[bytes], level: Level, ttl_s: float, session: str) -> int:
        """Evict ``keys`` after (RETAINED) or before (DEMOTED) ordinary blocks for ``ttl_s``."""
        with self._lock:
            return self._retention.mark(keys, level, ttl_s, session, self._clock())

    def release(self, session: str) -> int:
        with self._lock:
            return self._retention.release(session)

    # ----- write ------------------------------------------------------------
    def write(self, key: bytes, payload: memoryview | bytes) -> WriteOutcome:
        payload = bytes_view(payload)
        if len(payload) != self.layout.payload_bytes:
            raise SizeMismatch(self.layout.payload_bytes, len(payload))
        path = self.path_for(key)
        if os.path.exists(path):
            return self._skip_existing(key)
        if not self._reserve(self.block_file_bytes):
            return WriteOutcome.NO_SPACE
        try:
            self._write_file(key, path, payload)
        finally:
            with self._lock:
                self._reserved -= self.block_file_bytes
        with self._lock:
            self._index.touch(key, self.block_file_bytes, self._clock())
            self._counters.blocks_written += 1
            self._counters.bytes_written += self.block_file_bytes
            self._evict_locked(0)
        return WriteOutcome.WRITTEN

    def _skip_existing(self, key: bytes) -> WriteOutcome:
        with self._lock:
            self._index.touch(key, self.block_file_bytes, self._clock())
            self._counters.write_skipped += 1
        return WriteOutcome.EXISTS

    def _reserve(self, nbytes: int) -> bool:
        with self._lock:
            if not self._evict_locked(nbytes):
                self._counters.write_no_space += 1
                return False
            self._reserved += nbytes
            return True

    def _write_file(self, key: bytes, path: str, payload: memoryview) -> None:
        parent = os.path.dirname(path)
        self._ensure_dir(parent)
        write_file(path, key, self.fingerprint, self.layout, payload, fsync=self._fsync)

    def _ensure_dir(self, parent: str) -> None:
        if parent not in self._made_dirs:
            os.makedirs(parent, exist_ok=True)
            self._made_dirs.add(parent)

    # ----- capacity ---------------------------------------------------------
    def _evict_locked(self, incoming: int) -> bool:
        """Evict LRU unpinned blocks until ``incoming`` more bytes fit; a newer mtime earns a second chance."""
        if self.capacity_bytes is None:
            return True
        while self._index.total_bytes + self._reserved + incoming > self.capacity_bytes:
            key = self._retention.victim(self._index.iter_oldest_first(), self._index.is_pinned, self._clock())
            if key is None:
                return False
            entry = self._index.get(key)
            path = self.path_for(key)
            mtime = file_mtime(path)
            if mtime is not None and mtime > entry.used_at + 1e-3:
                self._index.touch(key, entry.size, mtime)
                continue
            unlink_quiet(path)
            self._index.remove(key)
            self._counters.evictions += int(mtime is not None)
            self._counters.evicted_bytes += entry.size if mtime is not None else 0
        return True

    def evict_to(self, capacity_bytes: int | None) -> None:
        with self._lock:
            self.capacity_bytes = capacity_bytes
            self._evict_locked(0)

    # ----- start-up scan ----------------------------------------------------
    def _scan(self, stale_temp_s: float) -> None:
        found = scan_blocks(self.dir, self._clock(), stale_temp_s)
        with self._lock:
            for mtime, key, size in found:
                self._index.touch(key, size, mtime)

    # ----- reporting --------------------------------------------------------
    def stats(self) -> StoreStats:
        with self._lock:
            return self._counters.snapshot(len(self._index), self._index.total_bytes, self.capacity_bytes)

    def resident_keys(self) -> list[bytes]:
        with self._lock:
            return self._index.keys_oldest_first()

    def check_integrity(self) -> None:
        with self._lock:
            self._index.check_integrity()
            self._retention.check_integrity()
            assert self._reserved >= 0, self._reserved
            cap = self.capacity_bytes
            assert cap is None or self._index.total_bytes <= cap or len(self._index) == 0

