"""One request's read chain: its blocks in order into their slots, stopping at the first miss.

Read on I/O threads (stripes) or, when the page cache holds it, on the event loop. Owns neither
threads nor slots (engine.py)."""
from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.storage_gateway.block_file import NotCached
from services.storage_gateway.errors import BlockUnavailable


@dataclass(slots=True)
class Chain:
    """Where a read chain stopped: blocks at or after ``stop`` are a miss; ``stop`` only decreases."""

    stop: int
    key: bytes | None = None
    reason: str | None = None
    cancelled: bool = False  # the caller left: stripes end after their current block
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, i: int, key: bytes, reason: str) -> None:
        with self.lock:
            if i < self.stop:
                self.stop, self.key, self.reason = i, key, reason

    def wants(self, i: int) -> bool:
        return i < self.stop and not self.cancelled


def _read_one(read, keys: Sequence[bytes], slots: Sequence[memoryview], chain: Chain, i: int) -> bool:
    """``read(keys[i], slots[i])``; False (the chain stopped at ``i``) on a miss or an OSError."""
    try:
        read(keys[i], slots[i])
        return True
    except BlockUnavailable as exc:
        chain.fail(i, keys[i], exc.reason)
    except OSError as exc:  # EIO, ESTALE, EACCES...: a miss, not a crash
        chain.fail(i, keys[i], f"{type(exc).__name__}: {exc}")
    except NotCached:
        raise
    except BaseException:  # a bug: the other stripes stop too, the call raises
        chain.cancelled = True
        raise
    return False


def read_chain(store, keys: Sequence[bytes], slots: Sequence[memoryview], chain: Chain,
               first: int = 0, step: int = 1) -> None:
    """I/O thread: blocks ``first, first+step, ...`` in order; stop at the first that fails."""
    for i in range(first, len(keys), step):
        if not chain.wants(i) or not _read_one(store.read_into, keys, slots, chain, i):
            return


def read_cached(store, keys: Sequence[bytes], slots: Sequence[memoryview], chain: Chain) -> int:
    """On the loop: the leading blocks the page cache holds whole; returns where the threads go on."""
    for i in range(len(keys)):
        try:
            if not _read_one(store.read_cached_into, keys, slots, chain, i):
                return i
        except NotCached:
            return i
    return len(keys)
