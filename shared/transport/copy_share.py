"""A bulk copy two threads share: the caller claims pieces from the front, the copy worker from the back."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np

View = memoryview | np.ndarray  # a memoryview or a 1-d uint8 array
Pair = tuple[View, View]  # (dst, src), equal lengths
SLICE = 128 << 10  # a shared transfer moves in pieces of at most this (a layer block is one)
TAIL = 2  # pieces the worker leaves to a helping caller


def cut(pairs: Sequence[Pair], size: int = SLICE) -> list[Pair]:
    """Non-empty pairs, in order, a longer one cut into pieces of at most `size` (numpy slices)."""
    out: list[Pair] = []
    for d, s in pairs:
        n = len(d)
        if n <= size:
            if n:
                out.append((d, s))
            continue
        dn = d if type(d) is np.ndarray else np.frombuffer(d, np.uint8)
        sn = s if type(s) is np.ndarray else np.frombuffer(s, np.uint8)
        out.extend((dn[o : o + size], sn[o : o + size]) for o in range(0, n, size))
    return out


class SharedCopy:
    """Each piece is claimed once, under the lock; while the caller helps, the worker leaves it the
    last TAIL pieces, so the caller normally completes the transfer (no wakeup from the worker)."""

    __slots__ = ("pieces", "lo", "hi", "busy", "lock", "fut", "loop", "exc", "helping")

    def __init__(self, pieces: list[Pair], fut: asyncio.Future[None], loop: asyncio.AbstractEventLoop,
                 helping: bool) -> None:
        self.pieces = pieces
        self.lo, self.hi = 0, len(pieces)  # unclaimed: pieces[lo:hi]
        self.busy = 0  # claimed, not yet finished
        self.lock = threading.Lock()
        self.fut, self.loop = fut, loop
        self.exc: BaseException | None = None
        self.helping = helping  # the caller copies (from the front)

    def worker_claim(self) -> Pair | None:
        """The worker's next piece, from the back, or None (none left, or the rest is the helping caller's)."""
        with self.lock:
            if self.hi - self.lo <= (TAIL if self.helping else 0):
                return None
            self.busy += 1
            self.hi -= 1
            return self.pieces[self.hi]

    def caller_claim(self, nbytes: int) -> list[Pair]:
        """The caller's next pieces from the front, about `nbytes` (at least one while any is unclaimed)."""
        out: list[Pair] = []
        with self.lock:
            while self.hi > self.lo and nbytes > 0:
                p = self.pieces[self.lo]
                self.lo += 1
                out.append(p)
                nbytes -= len(p[0])
            self.busy += len(out)
            return out

    def finish(self, exc: BaseException | None, count: int = 1) -> bool:
        """`count` claimed pieces landed (or failed with `exc`); True for the one call that completes
        the transfer (every piece claimed and landed, or failed and none in flight)."""
        with self.lock:
            self.busy -= count
            if exc is not None and self.exc is None:
                self.exc = exc
                self.hi = self.lo  # claim nothing more
            if self.hi > self.lo or self.busy:
                return False
            self.pieces = []  # drop the views now: lets shm regions unmap on close
            return True

    def unclaimed(self, helping: bool) -> int:
        """Set whether the caller still helps; returns the bytes nobody has claimed yet."""
        with self.lock:
            self.helping = helping
            return sum(len(d) for d, _ in self.pieces[self.lo : self.hi])

    def abandon(self) -> None:
        with self.lock:
            self.helping = False
            self.hi = self.lo
            if not self.busy:
                self.pieces = []
