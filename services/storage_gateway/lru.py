"""The in-process recency index of a directory store: sizes, recency, pins.

Pure bookkeeping: no I/O, no locking (the store holds its lock around every call)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(slots=True)
class LruEntry:
    size: int  # bytes on disk (header + payload)
    used_at: float  # wall-clock time of the last read/write we know of


class LruIndex:
    """Keys oldest-first; ``total_bytes`` is the sum of their sizes."""

    def __init__(self) -> None:
        self._entries: OrderedDict[bytes, LruEntry] = OrderedDict()
        self._pins: dict[bytes, int] = {}
        self.total_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def get(self, key: bytes) -> LruEntry | None:
        return self._entries.get(key)

    def touch(self, key: bytes, size: int, used_at: float) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.total_bytes -= old.size
        self._entries[key] = LruEntry(size, used_at)
        self.total_bytes += size

    def remove(self, key: bytes) -> int:
        """Forget ``key``; returns the bytes it accounted (0 when unknown)."""
        old = self._entries.pop(key, None)
        if old is None:
            return 0
        self.total_bytes -= old.size
        return old.size

    def pin(self, key: bytes) -> None:
        self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, key: bytes) -> None:
        left = self._pins[key] - 1
        if left:
            self._pins[key] = left
        else:
            del self._pins[key]

    def is_pinned(self, key: bytes) -> bool:
        return key in self._pins

    def oldest_unpinned(self) -> tuple[bytes, LruEntry] | None:
        for key, entry in self._entries.items():
            if key not in self._pins:
                return key, entry
        return None

    def keys_oldest_first(self) -> list[bytes]:
        return list(self._entries)

    def iter_oldest_first(self) -> Iterator[bytes]:
        """Keys least recently used first, without a copy (do not change the index meanwhile)."""
        return iter(self._entries)

    def check_integrity(self) -> None:
        total = sum(e.size for e in self._entries.values())
        assert total == self.total_bytes, (total, self.total_bytes)
        assert all(n > 0 for n in self._pins.values()), self._pins
        assert all(e.size >= 0 for e in self._entries.values())
