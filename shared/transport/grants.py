"""Grants: which byte ranges of which region a peer may reach, for one transfer."""

from __future__ import annotations

import bisect
import secrets
from collections.abc import Iterable

import msgspec

from .errors import NotGranted

TOKEN = 16  # bytes of a grant token: unguessable, so holding one is the right to use it
MAX_HANDLES = 4096  # grant handles one connection may hold bound; past it, revoked ones are forgotten


class Grant(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Reach `region` at [starts[i], ends[i]) (sorted, disjoint); a random `token` only its requester
    learns, checked by the server against its own copy."""

    token: bytes
    region: str
    starts: list[int]
    ends: list[int]
    read: bool = True
    write: bool = True

    def covers(self, offset: int, length: int, write: bool) -> bool:
        if not (self.write if write else self.read):
            return False
        i = bisect.bisect_right(self.starts, offset) - 1
        return i >= 0 and offset + length <= self.ends[i] and length >= 0

    def check(self, region: str, offset: int, length: int, write: bool) -> None:
        if region != self.region or not self.covers(offset, length, write):
            raise NotGranted(region, offset, length, "write" if write else "read")


def coalesce(ranges: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """(offset, length) pairs -> sorted disjoint [start, end) lists; touching ranges merge."""
    starts: list[int] = []
    ends: list[int] = []
    for off, n in sorted((o, n) for o, n in ranges if n > 0):
        if ends and off <= ends[-1]:
            ends[-1] = max(ends[-1], off + n)
        else:
            starts.append(off)
            ends.append(off + n)
    return starts, ends


def check_grant(peer: str, grant: Grant | None, ops: list, write: bool) -> Grant:
    """The initiator's own check that every op lies inside `grant` (tcp's server checks again)."""
    if grant is None:
        raise NotGranted(ops[0].remote_region if ops else "?", 0, 0, f"no grant given for {peer}")
    region, starts, ends, bisect_right = grant.region, grant.starts, grant.ends, bisect.bisect_right
    if not (grant.write if write else grant.read):
        raise NotGranted(region, 0, 0, "write" if write else "read")
    for o in ops:
        off, n = o.remote_offset, o.length
        i = bisect_right(starts, off) - 1
        if i < 0 or off + n > ends[i] or n < 0 or o.remote_region != region:
            raise NotGranted(o.remote_region, off, n, "write" if write else "read")
    return grant


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Grant)


def encode_grant(g: Grant | None) -> bytes:
    return _encoder.encode(g) if g is not None else b""


def decode_grant(raw: bytes) -> Grant | None:
    return _decoder.decode(raw) if raw else None


class GrantTable:
    """The serving side's live grants: token -> (grant, the region's whole view)."""

    def __init__(self) -> None:
        self._live: dict[bytes, tuple[Grant, memoryview]] = {}

    def __len__(self) -> int:
        return len(self._live)

    def add(self, region: str, size: int, view: memoryview, ranges: Iterable[tuple[int, int]] | None,
            read: bool, write: bool) -> Grant:
        starts, ends = coalesce(ranges) if ranges is not None else ([0], [size])
        if starts and (starts[0] < 0 or ends[-1] > size):
            raise NotGranted(region, starts[0], ends[-1] - starts[0], f"outside size {size}")
        g = Grant(secrets.token_bytes(TOKEN), region, starts, ends, read, write)
        self._live[g.token] = (g, view)
        return g

    def revoke(self, token: bytes) -> bool:
        return self._live.pop(token, None) is not None

    def known(self, token: bytes) -> bool:
        return token in self._live

    def view(self, token: bytes, offset: int, length: int, write: bool) -> memoryview:
        """The slice a peer's frame may touch; NotGranted unless its grant is live and covers it."""
        entry = self._live.get(token)
        if entry is None:
            raise NotGranted("?", offset, length, "no live grant")
        g, mv = entry
        i = bisect.bisect_right(g.starts, offset) - 1
        if i < 0 or offset + length > g.ends[i] or length < 0 or not (g.write if write else g.read):
            raise NotGranted(g.region, offset, length, "write" if write else "read")
        return mv[offset : offset + length]

    def clear(self) -> None:
        self._live.clear()


class Bindings:
    """A serving connection's handles -> bound tokens; `view` checks each frame against the live
    grant, so an unbound handle, an unknown token or a revoked grant reach nothing."""

    def __init__(self, table: GrantTable) -> None:
        self.table = table
        self._bound: dict[int, bytes] = {}

    def bind(self, handle: int, token: bytes) -> None:
        if len(self._bound) >= MAX_HANDLES:
            self._bound = {h: t for h, t in self._bound.items() if self.table.known(t)}
            if len(self._bound) >= MAX_HANDLES:
                self._bound.clear()
        self._bound[handle] = token

    def view(self, handle: int, offset: int, length: int, write: bool) -> memoryview:
        return self.table.view(self._bound.get(handle, b""), offset, length, write)


class Handles:
    def __init__(self) -> None:
        self._of: dict[bytes, int] = {}
        self._next = 0

    def of(self, token: bytes) -> tuple[int, bool]:
        """(handle, whether it is new and must be bound first)."""
        h = self._of.get(token)
        if h is not None:
            return h, False
        if len(self._of) >= MAX_HANDLES // 2:  # the server may have forgotten old ones: start over
            self._of.clear()
        self._next = (self._next + 1) & 0xFFFFFFFF or 1
        self._of[token] = self._next
        return self._next, True
