"""Local region table: name -> memoryview, with bounds checks; which regions peers may be granted."""

from __future__ import annotations

import numpy as np

from .base import RegionDesc
from .errors import OutOfBounds, RegionNotFound


def as_bytes_view(buf: memoryview | bytearray) -> memoryview:
    """A flat, writable, unsigned-byte view of `buf` (any C-contiguous buffer)."""
    mv = memoryview(buf)
    if mv.readonly:
        raise ValueError("region buffer must be writable")
    if not mv.c_contiguous:
        raise ValueError("region buffer must be C-contiguous")
    return mv.cast("B") if (mv.format != "B" or mv.ndim != 1) else mv


def check_bounds(region: str, offset: int, length: int, size: int) -> None:
    if offset < 0 or length < 0 or offset + length > size:
        raise OutOfBounds(region, offset, length, size)


class RegionTable:
    """Ids start at 1 and are never reused."""

    def __init__(self) -> None:
        self._by_name: dict[str, tuple[RegionDesc, memoryview]] = {}
        self._by_rid: dict[int, tuple[RegionDesc, memoryview]] = {}  # registered for remote peers only
        self._arrays: dict[str, np.ndarray] = {}  # name -> the whole region as uint8 (made on first use)
        self._next = 1

    def add(self, name: str, buf: memoryview | bytearray, *, shm_name: str = "", remote: bool = True,
            **extra: int) -> RegionDesc:
        if name in self._by_name:
            raise ValueError(f"region {name!r} already registered")
        mv = as_bytes_view(buf)
        desc = RegionDesc(name=name, size=len(mv), rid=self._next, shm=shm_name, **extra)
        self._next += 1
        self._by_name[name] = (desc, mv)
        if remote:
            self._by_rid[desc.rid] = (desc, mv)
        return desc

    def descs(self) -> list[RegionDesc]:
        return [d for d, _ in self._by_name.values()]

    def remote_descs(self) -> list[RegionDesc]:
        """The regions granted to remote peers: what an announcement may name."""
        return [d for d, _ in self._by_rid.values()]

    def desc(self, name: str) -> RegionDesc:
        try:
            return self._by_name[name][0]
        except KeyError:
            raise RegionNotFound(name) from None

    def resolve(self, name: str, offset: int, length: int) -> memoryview:
        try:
            desc, mv = self._by_name[name]
        except KeyError:
            raise RegionNotFound(name) from None
        check_bounds(name, offset, length, desc.size)
        return mv[offset : offset + length]

    def array(self, name: str) -> np.ndarray:
        """The whole region as a uint8 array, made once (cheaper to slice than a view)."""
        arr = self._arrays.get(name)
        if arr is None:
            try:
                arr = self._arrays[name] = np.frombuffer(self._by_name[name][1], np.uint8)
            except KeyError:
                raise RegionNotFound(name) from None
        return arr

    def resolve_array(self, name: str, offset: int, length: int) -> np.ndarray:
        arr = self.array(name)
        check_bounds(name, offset, length, len(arr))
        return arr[offset : offset + length]

    def remote_view(self, name: str) -> memoryview:
        """RegionNotFound for a local region, so no grant can ever open the engine's KV memory."""
        try:
            return self._by_rid[self._by_name[name][0].rid][1]
        except KeyError:
            raise RegionNotFound(name) from None

    def drop(self, name: str) -> int:
        """Forget region `name`; returns its position among `descs()` before the drop."""
        try:
            desc, _ = self._by_name[name]
        except KeyError:
            raise RegionNotFound(name) from None
        at = list(self._by_name).index(name)
        del self._by_name[name]
        self._by_rid.pop(desc.rid, None)
        self._arrays.pop(name, None)
        return at

    def clear(self) -> None:
        self._arrays.clear()
        self._by_name.clear()
        self._by_rid.clear()
