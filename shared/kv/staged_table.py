"""Stamps of a traffic-manager's staged entries in shared memory, so its own engine may copy them unasked.

A seqlock's reader side: the TM publishes a never-reused stamp once an entry is staged and
clears it before the entry's slots are freed; the engine copies, then checks the stamp is
still there, else discards the copy and fetches the usual way.
"""
from __future__ import annotations

import secrets

import numpy as np

from shared.transport.shm_region import ShmRegion, new_name

RECORDS = 4096  # entries published at once; one more is simply not published (its engine claims it)


class StagedTable:
    """`RECORDS` 8-byte stamps (0: free) in a shared-memory segment."""

    def __init__(self, region: ShmRegion, writer: bool):
        self.region = region
        self.stamps = np.frombuffer(region.buf, dtype=np.uint64, count=region.size // 8)
        self.writer = writer
        self._free = list(range(len(self.stamps) - 1, -1, -1)) if writer else []
        self._next = secrets.randbits(62) | 1

    @classmethod
    def create(cls, records: int = RECORDS) -> StagedTable:
        return cls(ShmRegion.create(new_name("tm-stg"), records * 8), writer=True)

    @classmethod
    def attach(cls, name: str) -> StagedTable:
        return cls(ShmRegion.attach(name), writer=False)

    @property
    def name(self) -> str:
        return self.region.name

    # writer ---------------------------------------------------------------------------------
    def publish(self) -> tuple[int, int] | None:
        """(record, stamp) of a newly published entry; None when every record is taken."""
        if not self._free:
            return None
        record, stamp = self._free.pop(), self._next
        self._next += 1
        self.stamps[record] = stamp
        return record, stamp

    def revoke(self, record: int) -> None:
        """The entry's slots are about to be freed: its stamp goes first."""
        if self.stamps[record]:
            self.stamps[record] = 0
            self._free.append(record)

    def clear(self) -> None:
        for record in np.flatnonzero(self.stamps):
            self.revoke(int(record))

    # reader ---------------------------------------------------------------------------------
    def valid(self, record: int, stamp: int) -> bool:
        """The entry still held its slots through a copy made before this call (x86-64 keeps loads in order)."""
        return 0 <= record < len(self.stamps) and int(self.stamps[record]) == stamp

    def close(self) -> None:
        self.stamps = None  # the view goes before the mapping
        self.region.close()
        if self.writer:
            self.region.unlink()
