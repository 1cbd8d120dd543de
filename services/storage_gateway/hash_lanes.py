"""Checksums computed beside the read: a pool of hash threads, each taking one read's
chunks in order, so chunk k is hashed on another core while chunk k+1 is read.

A warm block read is two passes over every byte: the kernel's page-cache copy into the
slot, then xxh3 over the slot. Done one after the other on one thread, the hash adds about
a third to the copy (8 MiB blocks: ~90 ms/GB copy, ~25-35 ms/GB hash on this machine's
cores); xxhash releases the GIL while it hashes, so a second thread can take the hash of
the chunk just read while the reading thread copies the next one, and the read takes
about as long as the copy alone. A read leases one lane (its own thread and queue) for its
whole length, so a streaming hasher sees its chunks in payload order; lanes are made on
demand, one per read running at once, and kept for the next.

Owns: ``HashLanes`` (a pool), ``HashLane`` (one thread), ``shared_lanes`` (the process's
pool: every store's reads share it, as they share the cores). Does not own the
reads nor the checksum format (``block_file.py``, ``shared/kv``).
"""
from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from queue import SimpleQueue
from typing import Any

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
# Worth a second thread only with a second core to run it on.
PIPELINE = CORES > 1
_STOP = None
_POOLS: weakref.WeakSet[HashLanes] = weakref.WeakSet()


class HashLane:
    """One hash thread: ``feed`` queues ``hasher.update(view)``, ``drain`` waits for all of them."""

    def __init__(self, name: str) -> None:
        self._jobs: SimpleQueue[tuple[Any, memoryview] | None] = SimpleQueue()
        self._done: SimpleQueue[BaseException | None] = SimpleQueue()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def feed(self, hasher: Any, view: memoryview) -> None:
        self._pending += 1
        self._jobs.put((hasher, view))

    def drain(self) -> None:
        """Every fed update has run (the first error among them is raised, after all ran)."""
        error: BaseException | None = None
        while self._pending:
            got = self._done.get()
            self._pending -= 1
            error = error or got
        if error is not None:
            raise error

    def stop(self) -> None:
        self._jobs.put(_STOP)
        self._thread.join()

    def _run(self) -> None:
        jobs, done = self._jobs, self._done
        while (job := jobs.get()) is not _STOP:
            hasher, view = job
            try:
                hasher.update(view)
            except BaseException as exc:  # handed to the reader, never lost on this thread
                done.put(exc)
            else:
                done.put(None)


class HashLanes:
    """Lanes leased one per read; a lease always ends drained (its views are no longer read).

    `cores`: a read gets a lane only while a core is left for its hash thread, i.e. while the
    reads in progress (this one included) and the lanes already hashing number fewer than
    `cores`; otherwise `lease` yields None and the read hashes on its own thread. Reads that
    run at once (a request's blocks striped over I/O threads) already fill the cores, and a
    hash thread beside each only adds hand-offs: on two cores, four reads of 8 MiB blocks
    into one buffer ran 1.35x faster hashed on their own threads than each beside a lane.
    None: a lane for every read."""

    def __init__(self, name: str = "sg-hash", cores: int | None = None) -> None:
        self._name = name
        self._cores = cores
        self._free: list[HashLane] = []
        self._all: list[HashLane] = []
        self._reading = 0  # leases held (reads in progress), with or without a lane
        self._hashing = 0  # leases holding a lane
        self._lock = threading.Lock()
        _POOLS.add(self)

    def _forget(self) -> None:
        """In a forked child: the parent's lane threads do not exist here; new ones are made."""
        self._free, self._all, self._lock = [], [], threading.Lock()
        self._reading = self._hashing = 0

    @contextmanager
    def lease(self) -> Iterator[HashLane | None]:
        with self._lock:
            self._reading += 1
            spare = self._cores is None or self._reading + self._hashing < self._cores
            self._hashing += spare
            lane = self._free.pop() if spare and self._free else None
        try:
            if spare and lane is None:
                lane = HashLane(f"{self._name}-{len(self._all)}")
                with self._lock:
                    self._all.append(lane)
            yield lane
        except BaseException:
            try:
                if lane is not None:
                    lane.drain()
            except BaseException:  # the read's own error is the one to raise
                pass
            raise
        else:
            if lane is not None:
                lane.drain()
        finally:
            with self._lock:
                self._reading -= 1
                self._hashing -= spare
                if lane is not None:
                    self._free.append(lane)

    def close(self) -> None:
        with self._lock:
            lanes, self._all, self._free = self._all, [], []
        for lane in lanes:
            lane.stop()

    @property
    def threads(self) -> int:
        return len(self._all)


_SHARED: HashLanes | None = None
_SHARED_LOCK = threading.Lock()


def shared_lanes() -> HashLanes | None:
    """The process's pool of hash lanes, made on first use; None on a single core."""
    global _SHARED
    if not PIPELINE:
        return None
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = HashLanes(cores=CORES)
        return _SHARED


def _after_fork_in_child() -> None:
    for pool in list(_POOLS):
        pool._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
