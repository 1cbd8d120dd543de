"""The stamps of a traffic-manager's prefetched entries in shared memory: what lets its own engine copy them without asking.

A prefetch (services/traffic_manager/prefetch.py) stages a session's stored blocks in the
traffic-manager's buffer. Its own prefill engine maps that buffer (same host, POSIX shared
memory) and may copy the blocks straight into its KV memory, with no message to the
traffic-manager on the way, under this protocol (a seqlock's reader side):

- writer (the traffic-manager, one process): once an entry's blocks are read and verified,
  it takes a free record and writes there a stamp never used before (`publish`); the stamp,
  the record and the slots travel to the engine inside the assignment (`StagedSlots`). Before
  the entry's slots are freed for any reason (used, TTL, release, buffer pressure, adoption,
  an engine restart) the record is cleared (`revoke`): clearing comes first, so any later
  write into those slots (another read, reused slots) happens after it.
- reader (the engine): copies the slots, then reads the record (`valid`). The stamp still
  there means the entry held its slots from before the engine heard of it until after the
  copy ended, so every byte copied is the staged block's. A cleared or reused record means
  the copy may be torn: the engine discards it and fetches the usual way (FetchKV, which
  claims what is left and reads the rest from storage). The check needs the copy's loads to
  happen before the record's load: x86-64's TSO keeps loads in order; the stamp is one aligned
  8-byte word, written and read whole.
Stamps start at a random 62-bit value and only grow, so a stamp is never seen twice, also
across a traffic-manager's restart (a new table, a new buffer).
"""
from __future__ import annotations

import secrets

import numpy as np

from shared.transport.shm_region import ShmRegion, new_name

RECORDS = 4096  # entries published at once; one more is simply not published (its engine claims it)


class StagedTable:
    """One table: `RECORDS` 8-byte stamps (0: free) in a shared-memory segment."""

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
        """Every entry is gone (the buffer was cut anew)."""
        for record in np.flatnonzero(self.stamps):
            self.revoke(int(record))

    # reader ---------------------------------------------------------------------------------
    def valid(self, record: int, stamp: int) -> bool:
        """The entry stamped `stamp` still holds its slots (read after the copy: see the module)."""
        return 0 <= record < len(self.stamps) and int(self.stamps[record]) == stamp

    def close(self) -> None:
        self.stamps = None  # the view goes before the mapping
        self.region.close()
        if self.writer:
            self.region.unlink()
