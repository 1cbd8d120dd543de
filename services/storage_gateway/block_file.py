"""One block file of the directory store: its atomic write and its verified read.

Write: header+payload to a unique temp file next to the target (``O_EXCL``), optional
fsync, ``os.replace`` onto the final name: readers see a whole file or none.
Read: one ``preadv`` of two iovecs -- header into a scratch, the payload's first chunk
straight into the caller's slice -- then the rest chunk by chunk into the same slice (no
intermediate copy): cached bytes in big reads that never wait for the disk
(``RWF_NOWAIT``), the others in small blocking reads; header fields verified, the payload
checksum computed in place as each chunk lands. A fault raises ``FullBlockError``.
Read in parts (``OpenBlock``: a read in layer groups): the header is checked when the file is
opened, each part of the payload lands (in payload order) and feeds the checksum, and the
checksum is checked after the last part.

Owns: the file-level protocols and chunk sizes, ``NotCached``. Does not own naming, the LRU index,
capacity, pins or counters (``store.py``), nor the format itself (``shared/kv``).
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

from services.storage_gateway import fileio
from services.storage_gateway.hash_lanes import HashLanes
from services.storage_gateway.scan import TEMP_SUFFIX
from shared.kv.full_block import (
    HEADER_SIZE,
    FullBlockHeader,
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
# Hashed beside the read (hash_lanes.py), a block's last chunks shrink to this: the hash
# that cannot overlap a read is the last chunk's (~8 us at 256 KiB, ~65 us at 2 MiB).
TAIL_CHUNK = 256 * 1024


def write_file(path: str, key: bytes, fingerprint: bytes, layout: KVLayout, payload: memoryview,
               *, fsync: bool) -> None:
    """Write one block file at `path` atomically (its directory exists)."""
    parent = os.path.dirname(path)
    tmp = os.path.join(parent, f".{key.hex()}.{os.getpid()}.{uuid.uuid4().hex}{TEMP_SUFFIX}")
    header = encode_header(key, fingerprint, layout, payload_checksum(payload))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            fileio.writev_all(fd, [memoryview(header), payload])
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        unlink_quiet(tmp)
        raise
    if fsync:
        fileio.fsync_dir(parent)


class NotCached(Exception):
    """A read that may not wait for the disk met a byte the page cache does not hold."""


@dataclass
class OpenBlock:
    """A block file open for a read in parts: header checked, checksum fed as the payload lands."""

    key: bytes
    fd: int
    st: os.stat_result
    header: FullBlockHeader
    hasher: object  # xxh3_64 of the payload so far
    read: int = 0  # payload bytes read so far (parts come in payload order)


class BlockReader:
    """Verified reads of one model's block files; remembers a file system without RWF_NOWAIT."""

    def __init__(self, fingerprint: bytes, layout: KVLayout, lanes: HashLanes | None = None):
        self.fingerprint = fingerprint
        self.layout = layout
        self.lanes = lanes  # hash beside the read (None: hash on the reading thread)
        self.file_bytes = HEADER_SIZE + layout.payload_bytes
        self.nowait_reads = True  # until the file system refuses RWF_NOWAIT

    def read_fd(self, fd: int, st: os.stat_result, key: bytes, dest: memoryview, cached_only: bool = False) -> None:
        """Header and a small first chunk in one ``preadv``; then what the page
        cache holds in big non-blocking reads, the rest in small blocking ones.
        ``cached_only``: every read non-blocking, ``NotCached`` at the first byte not cached."""
        if st.st_size != self.file_bytes:
            raise SizeMismatch(self.file_bytes, st.st_size, what="file")
        header = bytearray(HEADER_SIZE)
        if cached_only:
            if self._pread_cached(fd, memoryview(header), 0) != HEADER_SIZE:
                raise NotCached
            off = 0
        else:
            off = len(first := dest[:COLD_CHUNK])
            pread(fd, [memoryview(header), first], 0)
        hdr = decode_header(header, expected_key=key, expected_fingerprint=self.fingerprint,
                            expected_layout=self.layout)
        hasher = payload_hasher()
        beside = self.lanes is not None and len(dest) > READ_CHUNK
        with self.lanes.lease() if beside else nullcontext() as lane:
            if lane is None:  # hashed here (one chunk, no pool, or every core busy reading)
                self._fill(fd, dest, off, cached_only, hasher.update, hasher.update, taper=False)
            else:  # hashed on another core, chunk by chunk, while the next chunk is read

                def last(view: memoryview) -> None:  # hashed here: no wake-up to wait for
                    lane.drain()
                    hasher.update(view)

                self._fill(fd, dest, off, cached_only, lambda view: lane.feed(hasher, view), last, taper=True)
        check_checksum(hdr, hasher.intdigest())

    def _fill(self, fd: int, dest: memoryview, off: int, cached_only: bool,
              feed: Callable[[memoryview], object], last: Callable[[memoryview], object],
              taper: bool) -> None:
        """``dest[off:]`` from the payload at ``off``, each landed piece (and ``dest[:off]``
        first) passed to ``feed`` in payload order, the piece that ends the payload to
        ``last``. ``taper``: the last chunks halve (down to ``TAIL_CHUNK``), so the hash
        left after the last read is a small one."""
        if off:
            (last if off >= len(dest) else feed)(dest[:off])
        while off < len(dest):
            left = len(dest) - off
            size = READ_CHUNK if not taper or left > 2 * READ_CHUNK else max(TAIL_CHUNK, left // 2)
            part = dest[off : off + size]
            got = self._pread_cached(fd, part, HEADER_SIZE + off)
            if got == 0:  # not cached (or no such read here): wait for the disk
                if cached_only:
                    raise NotCached
                part = dest[off : off + COLD_CHUNK]
                got = pread(fd, [part], HEADER_SIZE + off)
            off += got
            (last if off >= len(dest) else feed)(part[:got])

    def open_fd(self, fd: int, st: os.stat_result, key: bytes) -> OpenBlock:
        """Check the size and header of an open block file; its payload is read in parts next."""
        if st.st_size != self.file_bytes:
            raise SizeMismatch(self.file_bytes, st.st_size, what="file")
        header = bytearray(HEADER_SIZE)
        pread(fd, [memoryview(header)], 0)
        hdr = decode_header(header, expected_key=key, expected_fingerprint=self.fingerprint,
                            expected_layout=self.layout)
        return OpenBlock(key, fd, st, hdr, payload_hasher())

    def read_part(self, ob: OpenBlock, dest: memoryview) -> None:
        """The next ``len(dest)`` payload bytes of ``ob`` into ``dest``, hashed as they land."""
        off, end = 0, len(dest)
        while off < end:
            at = HEADER_SIZE + ob.read + off
            part = dest[off:off + READ_CHUNK]
            got = self._pread_cached(ob.fd, part, at)
            if got == 0:
                part = dest[off:off + COLD_CHUNK]
                got = pread(ob.fd, [part], at)
            ob.hasher.update(part[:got])
            off += got
        ob.read += end

    def verify(self, ob: OpenBlock) -> None:
        """The whole payload has been read: its checksum must match the header's."""
        if ob.read != self.layout.payload_bytes:
            raise SizeMismatch(self.layout.payload_bytes, ob.read, what="payload read")
        check_checksum(ob.header, ob.hasher.intdigest())

    def _pread_cached(self, fd: int, part: memoryview, offset: int) -> int:
        if not self.nowait_reads:
            return 0
        got = fileio.pread_cached(fd, part, offset)
        if got is None:  # the file system has no non-blocking reads: stop asking
            self.nowait_reads = False
            return 0
        return got


def bytes_view(buf: memoryview | bytes | bytearray) -> memoryview:
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def pread(fd: int, bufs: list[memoryview], offset: int) -> int:
    want = sum(len(b) for b in bufs)
    got = fileio.preadv_exact(fd, bufs, offset)
    if got != want:  # truncated while we read
        raise SizeMismatch(want, got, what="file read")
    return got


def file_mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return None


def unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def check_slots(
    dest_len: int, size: int, keys: Sequence[bytes], offsets: Sequence[int]
) -> None:
    """Every slot inside ``dest`` and no two overlapping (stripes write them from
    different threads: a shared byte would fail a good block's checksum); ValueError if not."""
    if len(keys) != len(offsets):
        raise ValueError(f"{len(keys)} keys but {len(offsets)} offsets")
    for off in offsets:
        if off < 0 or off + size > dest_len:
            raise ValueError(f"slot [{off}, {off + size}) outside dest of {dest_len} bytes")
    ordered = sorted(offsets)
    for a, b in zip(ordered, ordered[1:]):
        if b - a < size:
            raise ValueError(f"slots at {a} and {b} overlap ({size}-byte slots)")
