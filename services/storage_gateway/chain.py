"""One request's read chain: its blocks in order into their slots, stopping at the first miss,
on read threads (stripes) or, when the page cache holds it, on the event loop.

A chain of keys ``[k0, k1, k2]`` starts with ``stop = 3``; a block that is missing, corrupt or
unreadable (an OSError) at index 1 sets ``stop = 1`` with its key and reason, and no stripe
starts a block past it. Stripe ``s`` of ``k`` reads blocks ``s, s+k, ...`` (``read_chain``).

The loop's share (``read_cached``): a request small enough for one stripe, with no stripe of
another running (nobody is overtaken), is read by the loop itself from the page cache, each
chunk a non-blocking read (``RWF_NOWAIT``), checked and hashed as on a thread; the first
block with a byte not cached ends the loop's share (nothing of it counts) and the threads read
from there. So a warm one-block read costs no thread hand-off at all (two wake-ups, 0.06 ms
idle and 0.35 ms median on two loaded cores, against ~0.5 ms of copying 8 MiB), and the loop
is held for at most one such request's copy (``inline_bytes``). Its open and fstat run on the
loop too: cached with the data on a local file system; on a file system without
``RWF_NOWAIT`` nothing is read on the loop.

Owns: ``Chain``, ``read_chain``, ``read_cached``. Does not own threads or slots (``engine.py``).
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.storage_gateway.block_file import NotCached
from services.storage_gateway.errors import BlockUnavailable


@dataclass(slots=True)
class Chain:
    """Where a read chain stopped: blocks at or after ``stop`` are a miss. Shared by
    the stripes of one request, each on its own thread; ``stop`` only decreases."""

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
        """Block ``i`` may still count (a stale read only costs one wasted block)."""
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
    """I/O thread: read blocks ``first, first+step, ...`` in order into their slots; stop at
    the first that fails or once the chain stopped before it."""
    for i in range(first, len(keys), step):
        if not chain.wants(i) or not _read_one(store.read_into, keys, slots, chain, i):
            return


def read_cached(store, keys: Sequence[bytes], slots: Sequence[memoryview], chain: Chain) -> int:
    """On the loop: the leading blocks the page cache holds whole, read and verified (a miss
    stops the chain as on a thread); returns the index the threads go on from."""
    for i in range(len(keys)):
        try:
            if not _read_one(store.read_cached_into, keys, slots, chain, i):
                return i
        except NotCached:
            return i
    return len(keys)
