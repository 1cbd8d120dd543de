"""Counters of one directory store and their reportable snapshot."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import msgspec


class StoreStats(msgspec.Struct, frozen=True, kw_only=True):
    blocks: int  # blocks in this gateway's index
    bytes: int  # bytes they take on disk (headers included)
    capacity_bytes: int | None
    blocks_read: int
    bytes_read: int  # payload bytes delivered to callers
    blocks_written: int
    bytes_written: int  # file bytes written (headers included)
    write_skipped: int  # writes of a block that already existed
    write_no_space: int  # writes dropped: every resident block was pinned
    hit_blocks: int  # lookups (contains / longest_prefix) that found a block
    miss_blocks: int  # blocks after the hit prefix (they must be computed)
    read_misses: int  # reads of a block with no file
    corrupt: int  # blocks that failed verification and were deleted
    evictions: int
    evicted_bytes: int


@dataclass(slots=True)
class StoreCounters:
    blocks_read: int = 0
    bytes_read: int = 0
    blocks_written: int = 0
    bytes_written: int = 0
    write_skipped: int = 0
    write_no_space: int = 0
    hit_blocks: int = 0
    miss_blocks: int = 0
    read_misses: int = 0
    corrupt: int = 0
    evictions: int = 0
    evicted_bytes: int = 0

    def snapshot(self, blocks: int, nbytes: int, capacity: int | None) -> StoreStats:
        return StoreStats(blocks=blocks, bytes=nbytes, capacity_bytes=capacity, **asdict(self))
