"""The directory store: Full Blocks as files under one root (local disk or any
shared POSIX mount — 3FS FUSE, CephFS, Lustre, NFS; many gateways may share a root).

Layout: ``<root>/kv-<fingerprint hex>/<k[0:2]>/<k[2:4]>/<key hex>.kvb``; each file
is a Full Block (``shared/kv/full_block.py``). One model's blocks live under their
own fingerprint directory; keys are salted by the fingerprint anyway.

Protocol of one write: ``exists? -> skip``; reserve space (evict LRU, unpinned);
write header+payload to a unique temp file in the target directory (``O_EXCL``);
optional fsync; ``os.replace`` onto the final name. Concurrent writers of the same
block each rename a complete file with identical content; the last rename wins.

Protocol of one read: pin; open; fstat (size check); one ``preadv`` of two iovecs —
header into a 4 KiB scratch, the payload's first chunk straight into the caller's
slice — then the rest chunk by chunk into the same slice (no intermediate copy):
cached bytes in big reads that never wait for the disk (``RWF_NOWAIT``), the others
in small blocking reads; header fields verified, the payload checksum computed in
place as each chunk lands; touch mtime (throttled); unpin.
Any fault deletes that exact file (inode-checked), is counted, and raises
``BlockCorrupt``; no file raises ``BlockMissing``. Either is a miss, never wrong
output. Eviction unlinks; on POSIX a reader holding the file open keeps reading the
old inode intact, so eviction by another gateway never corrupts a read in flight.

Owns: ``DirectoryStore``, ``WriteOutcome``.
Does not own: the LRU bookkeeping (``lru.py``), the format (``shared/kv``),
rate limiting or threads (``engine.py``).
"""

from __future__ import annotations

import enum
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from services.storage_gateway import fileio
from services.storage_gateway.errors import BlockCorrupt, BlockMissing
from services.storage_gateway.lru import LruIndex
from services.storage_gateway.scan import SUFFIX, TEMP_SUFFIX, scan_blocks
from services.storage_gateway.stats import StoreCounters, StoreStats
from shared.kv.full_block import (
    HEADER_SIZE,
    FullBlockError,
    SizeMismatch,
    check_checksum,
    decode_header,
    encode_header,
    payload_checksum,
    payload_hasher,
)
from shared.kv.layout import KVLayout

# Bytes per read syscall, each hashed right after it lands (while cache-hot). Cached
# bytes come in big reads (8 MiB blocks: 1.16x faster at 2 MiB than 256 KiB, no gain
# past it); bytes not cached in small ones, so the kernel's read-ahead runs ahead of
# the copy and the hash (cold: 1.6x faster at 256 KiB than at 2 MiB).
READ_CHUNK = 2 * 2**20
COLD_CHUNK = 256 * 1024


class WriteOutcome(enum.IntEnum):
    WRITTEN = 0
    EXISTS = 1  # already stored: skipped
    NO_SPACE = 2  # capacity full of pinned blocks: dropped


class DirectoryStore:
    """Full Blocks of one model under ``root``; thread-safe (call from a pool)."""

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
        self._reserved = 0  # bytes of writes in flight (counted against capacity)
        self._counters = StoreCounters()
        self._made_dirs: set[str] = set()
        self._nowait_reads = True  # until the file system refuses RWF_NOWAIT
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
        n = 0
        for key in keys:
            if not self.contains(key):
                break
            n += 1
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

    # ----- write ------------------------------------------------------------
    def write(self, key: bytes, payload: memoryview | bytes) -> WriteOutcome:
        """Store one Full Block payload atomically; existing blocks are skipped."""
        payload = _bytes_view(payload)
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
        tmp = os.path.join(parent, f".{key.hex()}.{os.getpid()}.{uuid.uuid4().hex}{TEMP_SUFFIX}")
        header = encode_header(key, self.fingerprint, self.layout, payload_checksum(payload))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                fileio.writev_all(fd, [memoryview(header), payload])
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            _unlink_quiet(tmp)
            raise
        if self._fsync:
            fileio.fsync_dir(parent)

    def _ensure_dir(self, parent: str) -> None:
        if parent not in self._made_dirs:
            os.makedirs(parent, exist_ok=True)
            self._made_dirs.add(parent)

    # ----- read -------------------------------------------------------------
    def read_into(self, key: bytes, dest: memoryview) -> int:
        """Read block ``key``'s payload straight into ``dest[:payload_bytes]``.

        Returns the payload bytes. Raises ``BlockMissing`` / ``BlockCorrupt``.
        """
        dest = _bytes_view(dest)
        size = self.layout.payload_bytes
        if len(dest) < size or dest.readonly:
            raise ValueError(f"dest must be a writable buffer of >= {size} bytes")
        with self.pinned([key]):
            self._read_verified(key, dest[:size])
        with self._lock:
            self._index.touch(key, self.block_file_bytes, self._clock())
            self._counters.blocks_read += 1
            self._counters.bytes_read += size
            self._evict_locked(0)  # a block another gateway wrote may be new to us
        return size

    def _read_verified(self, key: bytes, dest: memoryview) -> None:
        path = self.path_for(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            self._forget(key, read_miss=True)
            raise BlockMissing(key) from None
        try:
            st = os.fstat(fd)
            try:
                self._read_fd(fd, st, key, dest)
            except FullBlockError as exc:
                self._discard_corrupt(path, st, key)
                raise BlockCorrupt(key, str(exc)) from exc
            self._maybe_touch(path, st)
        finally:
            os.close(fd)

    def _read_fd(self, fd: int, st: os.stat_result, key: bytes, dest: memoryview) -> None:
        """Header and a small first chunk in one ``preadv``; then what the page
        cache holds in big non-blocking reads, the rest in small blocking ones."""
        if st.st_size != self.block_file_bytes:
            raise SizeMismatch(self.block_file_bytes, st.st_size, what="file")
        header = bytearray(HEADER_SIZE)
        first = dest[:COLD_CHUNK]
        _pread(fd, [memoryview(header), first], 0)
        hdr = decode_header(
            header,
            expected_key=key,
            expected_fingerprint=self.fingerprint,
            expected_layout=self.layout,
        )
        hasher = payload_hasher()
        hasher.update(first)
        off = len(first)
        while off < len(dest):
            part = dest[off : off + READ_CHUNK]
            got = self._pread_cached(fd, part, HEADER_SIZE + off)
            if got == 0:  # not cached (or no such read here): wait for the disk
                part = dest[off : off + COLD_CHUNK]
                got = _pread(fd, [part], HEADER_SIZE + off)
            hasher.update(part[:got])
            off += got
        check_checksum(hdr, hasher.intdigest())

    def _pread_cached(self, fd: int, part: memoryview, offset: int) -> int:
        if not self._nowait_reads:
            return 0
        got = fileio.pread_cached(fd, part, offset)
        if got is None:  # the file system has no non-blocking reads: stop asking
            self._nowait_reads = False
            return 0
        return got

    def _maybe_touch(self, path: str, st: os.stat_result) -> None:
        """Share recency with other gateways on the same root via mtime."""
        if self._clock() - st.st_mtime < self._touch_interval_s:
            return
        try:
            os.utime(path)
        except OSError:  # gone meanwhile, or not ours to touch: recency is a hint
            pass

    def _discard_corrupt(self, path: str, st: os.stat_result, key: bytes) -> None:
        fileio.unlink_if_same(path, st)
        with self._lock:
            self._index.remove(key)
            self._counters.corrupt += 1

    def _forget(self, key: bytes, *, read_miss: bool) -> None:
        with self._lock:
            self._index.remove(key)
            self._counters.read_misses += int(read_miss)

    # ----- capacity ---------------------------------------------------------
    def _evict_locked(self, incoming: int) -> bool:
        """Evict LRU unpinned blocks until ``incoming`` more bytes fit.

        Before evicting a victim, its mtime is checked: another gateway that read
        it more recently (and touched it) earns it a second chance.
        """
        if self.capacity_bytes is None:
            return True
        while self._index.total_bytes + self._reserved + incoming > self.capacity_bytes:
            victim = self._index.oldest_unpinned()
            if victim is None:
                return False
            key, entry = victim
            path = self.path_for(key)
            mtime = _mtime(path)
            if mtime is not None and mtime > entry.used_at + 1e-3:
                self._index.touch(key, entry.size, mtime)
                continue
            _unlink_quiet(path)
            self._index.remove(key)
            self._counters.evictions += int(mtime is not None)
            self._counters.evicted_bytes += entry.size if mtime is not None else 0
        return True

    def evict_to(self, capacity_bytes: int | None) -> None:
        """Change the capacity and evict down to it now."""
        with self._lock:
            self.capacity_bytes = capacity_bytes
            self._evict_locked(0)

    # ----- start-up scan ----------------------------------------------------
    def _scan(self, stale_temp_s: float) -> None:
        """Rebuild the LRU index from the files under the root, oldest mtime first."""
        found = scan_blocks(self.dir, self._clock(), stale_temp_s)
        with self._lock:
            for mtime, key, size in found:
                self._index.touch(key, size, mtime)

    # ----- reporting --------------------------------------------------------
    def stats(self) -> StoreStats:
        with self._lock:
            return self._counters.snapshot(
                len(self._index), self._index.total_bytes, self.capacity_bytes
            )

    def resident_keys(self) -> list[bytes]:
        """Keys in this store's index, least recently used first."""
        with self._lock:
            return self._index.keys_oldest_first()

    def check_integrity(self) -> None:
        with self._lock:
            self._index.check_integrity()
            assert self._reserved >= 0, self._reserved
            cap = self.capacity_bytes
            assert cap is None or self._index.total_bytes <= cap or len(self._index) == 0


def _bytes_view(buf: memoryview | bytes | bytearray) -> memoryview:
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _pread(fd: int, bufs: list[memoryview], offset: int) -> int:
    want = sum(len(b) for b in bufs)
    got = fileio.preadv_exact(fd, bufs, offset)
    if got != want:  # truncated while we read
        raise SizeMismatch(want, got, what="file read")
    return got


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return None


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
