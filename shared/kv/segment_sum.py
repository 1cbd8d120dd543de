"""The payload checksum of a Full Block (format version 3): xxh3_64 over its 1 MiB segments' digests."""
from __future__ import annotations

import struct

import xxhash

SEGMENT = 2**20  # bytes per digest: one xxh3 call per MiB; a 3 MB block splits 1 + 2 MiB
_LE64 = struct.Struct("<Q")
_hash = xxhash.xxh3_64_intdigest


def _bytes(data: memoryview | bytes | bytearray) -> memoryview:
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def segmented_checksum(payload: memoryview | bytes | bytearray) -> int:
    h = SegmentHasher()
    h.update(payload)
    return h.intdigest()


def split_point(n: int) -> int:
    """The segment boundary nearest the middle of an `n`-byte payload (0: one segment, no split)."""
    segments = -(-n // SEGMENT)
    return (segments // 2) * SEGMENT if segments > 1 else 0


class SegmentHasher:
    """Digests of payload bytes fed in order from offset `start` (a segment boundary); one started
    at 0 and fed everything gives `segmented_checksum`."""

    __slots__ = ("start", "fed", "_sums", "_open")

    def __init__(self, start: int = 0) -> None:
        if start % SEGMENT:
            raise ValueError(f"start {start} is not a multiple of the {SEGMENT}-byte segment")
        self.start = start
        self.fed = 0  # bytes fed so far
        self._sums = bytearray()  # le64 digests of the segments closed so far
        self._open: xxhash.xxh3_64 | None = None  # the segment being fed, when it is not whole yet

    def update(self, data: memoryview | bytes | bytearray) -> None:
        view = _bytes(data)
        at, n = 0, len(view)
        if self._open is not None:  # finish the segment an earlier update began
            take = min(SEGMENT - self.fed % SEGMENT, n)
            self._open.update(view[:take])
            at = take
            if (self.fed + take) % SEGMENT == 0:
                self._sums += _LE64.pack(self._open.intdigest())
                self._open = None
        while n - at >= SEGMENT:
            self._sums += _LE64.pack(_hash(view[at : at + SEGMENT]))
            at += SEGMENT
        if at < n:
            self._open = xxhash.xxh3_64(view[at:])
        self.fed += n

    def digests(self) -> bytes:
        return bytes(self._sums) + (_LE64.pack(self._open.intdigest()) if self._open is not None else b"")

    def intdigest(self) -> int:
        return _hash(self.digests())

    def join(self, after: SegmentHasher) -> None:
        """Append `after`'s digests: it hashed the bytes right after this hasher's, from a segment
        boundary (ValueError otherwise)."""
        if self.fed % SEGMENT or after.start != self.start + self.fed:
            raise ValueError(f"part at {after.start} does not follow {self.fed} bytes from {self.start}")
        self._sums += after.digests()
        self._open = None
        self.fed += after.fed
