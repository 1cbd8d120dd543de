"""A second core for one block's read: lane threads that read and hash a block's far half.

The reading thread does the near half; a lane is leased for a whole read and ends drained.
Owns neither the reads nor the checksum format."""
from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from queue import SimpleQueue

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
# Worth a second thread only with a second core to run it on.
PIPELINE = CORES > 1
_STOP = None
_POOLS: weakref.WeakSet[HashLanes] = weakref.WeakSet()


class HashLane:
    def __init__(self, name: str) -> None:
        self._jobs: SimpleQueue[Callable[[], object] | None] = SimpleQueue()
        self._done: SimpleQueue[BaseException | None] = SimpleQueue()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def run(self, call: Callable[[], object]) -> None:
        self._pending += 1
        self._jobs.put(call)

    def drain(self) -> None:
        """Every queued call has ended; the first error among them is raised."""
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
        while (call := jobs.get()) is not _STOP:
            try:
                call()
            except BaseException as exc:  # handed to the reader, never lost on this thread
                done.put(exc)
            else:
                done.put(None)


class HashLanes:
    """Lanes leased one per read, only while a core is left for the lane (`cores`; None: always);
    otherwise `lease` yields None and the read hashes on its own thread."""

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
        """In a forked child: the parent's lane threads do not exist here."""
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
