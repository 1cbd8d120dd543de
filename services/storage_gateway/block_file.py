"""One block file of the directory store: its atomic write and its verified read.

A reader sees a whole file or none; a fault raises ``FullBlockError``. Owns neither naming,
capacity nor counters (store.py), nor the format (shared/kv)."""
from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
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
from shared.kv.segment_sum import SegmentHasher, split_point

# Bytes per read syscall, each hashed right after it lands (while cache-hot). Cached
# bytes come in big reads (8 MiB blocks: 1.16x faster at 2 MiB than 256 KiB, no gain
# past it); bytes not cached in small ones, so the kernel's read-ahead runs ahead of
# the copy and the hash (cold: 1.6x faster at 256 KiB than at 2 MiB).
READ_CHUNK = 2 * 2**20
COLD_CHUNK = 256 * 1024


def write_file(path: str, key: bytes, fingerprint: bytes, layout: KVLayout, payload: memoryview,
               *, fsync: bool) -> None:
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
    hasher: object  # the checksum of the payload so far (the header's version's hasher)
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
        """Header and first chunk in one ``preadv``, then cached bytes in big non-blocking reads, the rest
        in small blocking ones. ``cached_only``: ``NotCached`` at the first byte not cached."""
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
        hasher = payload_hasher(hdr.version)
        size = len(dest)
        split = split_point(size) if hdr.version >= 3 and self.lanes is not None and size > READ_CHUNK else 0
        split = split if split > off else 0  # the near half holds at least what the header's read brought
        with self.lanes.lease() if split else nullcontext() as lane:
            if lane is None:  # all on this thread (a small or version-2 block, no pool, or every core busy)
                self._fill(fd, dest, 0, size, cached_only, hasher, landed=off)
            else:  # the far half read and hashed on another core meanwhile, into a hasher of its own
                far = SegmentHasher(split)
                lane.run(lambda: self._fill(fd, dest, split, size, cached_only, far))
                self._fill(fd, dest, 0, split, cached_only, hasher, landed=off)
                lane.drain()
                hasher.join(far)
        check_checksum(hdr, hasher.intdigest())

    def _fill(self, fd: int, dest: memoryview, off: int, end: int, cached_only: bool, hasher,
              landed: int = 0) -> None:
        """``dest[off:end]`` from the payload, each piece fed to ``hasher`` as it lands, in order."""
        if landed:
            hasher.update(dest[off : off + landed])
            off += landed
        while off < end:
            part = dest[off : min(off + READ_CHUNK, end)]
            got = self._pread_cached(fd, part, HEADER_SIZE + off)
            if got == 0:  # not cached (or no such read here): wait for the disk
                if cached_only:
                    raise NotCached
                part = dest[off : min(off + COLD_CHUNK, end)]
                got = pread(fd, [part], HEADER_SIZE + off)
            hasher.update(part[:got])
            off += got

    def open_fd(self, fd: int, st: os.stat_result, key: bytes) -> OpenBlock:
        if st.st_size != self.file_bytes:
            raise SizeMismatch(self.file_bytes, st.st_size, what="file")
        header = bytearray(HEADER_SIZE)
        pread(fd, [memoryview(header)], 0)
        hdr = decode_header(header, expected_key=key, expected_fingerprint=self.fingerprint,
                            expected_layout=self.layout)
        return OpenBlock(key, fd, st, hdr, payload_hasher(hdr.version))

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
    """Every slot inside ``dest`` and no two overlapping (stripes write them from several threads)."""
    if len(keys) != len(offsets):
        raise ValueError(f"{len(keys)} keys but {len(offsets)} offsets")
    for off in offsets:
        if off < 0 or off + size > dest_len:
            raise ValueError(f"slot [{off}, {off + size}) outside dest of {dest_len} bytes")
    ordered = sorted(offsets)
    for a, b in zip(ordered, ordered[1:]):
        if b - a < size:
            raise ValueError(f"slots at {a} and {b} overlap ({size}-byte slots)")
