"""The traffic-manager's DRAM buffer as a pool of slots, one KV block each.

Never frees a slot a storage read or write still targets. Owns neither the data plane, the bus
nor the KV memory."""
from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import Gauge

from services.traffic_manager.waitline import WaitLine
from shared.engine.requests import RecentSet
from shared.kv.allocator import SlotAllocator
from shared.messages.registry import KVRegion
from shared.transport.shm_region import ShmRegion

PARKED = "~writing"  # freed slots a storage write still reads: free once it ends


class BufferPool:
    def __init__(self, buffer: ShmRegion, wait_s: float, m_free: Gauge,
                 on_free: Callable[[str], None] = lambda owner: None):
        self.buffer = buffer
        self.on_free = on_free  # told when an owner's slots are freed (its data-plane grant ends)
        self.wait_s = wait_s  # the longest wait in line for room (the transfer deadline)
        self.m_free = m_free  # free bytes, kept current
        self.layout: KVRegion | None = None  # set by attach()
        self.slots: SlotAllocator | None = None
        self.line: WaitLine | None = None
        self.cancelled = RecentSet()  # released/cancelled ids: a reservation arriving after them is dropped
        self.busy: Counter[str] = Counter()  # requests whose slots storage reads or writes still target (how many)
        self.free_later: set[str] = set()  # released while busy: freed when the read ends
        self.reclaim: Callable[[int], None] | None = None  # frees prefetched slots for a reservation (prefetch.py)
        self.pinned: Counter[int] = Counter()  # slot -> storage writes reading it now
        self.before_free: Callable[[str], None] = lambda owner: None  # may take some of owner's slots (pending.py)

    @property
    def ready(self) -> bool:
        """Slots exist: the engine's KV layout (hence the block size) is known."""
        return self.slots is not None

    @property
    def block_nbytes(self) -> int:
        return self.layout.block_nbytes if self.layout else 0

    def free_bytes(self) -> int:
        return self.slots.free * self.layout.block_nbytes if self.slots else self.buffer.size

    def attach(self, layout: KVRegion) -> None:
        """Cut the buffer into slots of `layout.block_nbytes` (again when the engine restarted)."""
        self.layout = layout
        self.slots = SlotAllocator(max(1, self.buffer.size // layout.block_nbytes))
        self.line = WaitLine(self.slots)
        self.pinned = Counter()
        self.m_free.set(self.free_bytes())

    async def allocate_wait(self, owner: str, n: int) -> list[int]:
        """`n` slots, waiting in line up to the transfer deadline; prefetched blocks give theirs up first."""
        short = n - self.line.spare()
        if short > 0 and self.reclaim is not None:
            self.reclaim(short)
        return await self.line.allocate(owner, n, self.wait_s, lambda o: o in self.cancelled)

    def spare(self) -> int:
        """Free slots nobody is waiting for (what best-effort persistence may take)."""
        return self.line.spare()

    def cancel(self, req_id: str) -> None:
        """Free the request's slots and refuse its late reservations."""
        self.cancelled.add(req_id)
        self.free(req_id)

    def free(self, req_id: str) -> None:
        """Free `req_id`'s slots now, or when the storage read targeting them ends."""
        self.before_free(req_id)
        if req_id in self.busy:
            self.free_later.add(req_id)
            return
        self.on_free(req_id)
        self._park(req_id)
        if self.slots is not None and self.slots.release(req_id):
            self.note_free()

    def release(self, owner: str) -> None:
        """Free `owner`'s slots now (the caller knows no read targets them)."""
        self.on_free(owner)
        self._park(owner)
        if self.slots is not None:
            self.slots.release(owner)
        self.note_free()

    def pin(self, slots: list[int]) -> None:
        """A storage write reads these slots from now on: freeing them waits for `unpin`."""
        self.pinned.update(slots)

    def unpin(self, slots: list[int]) -> None:
        done = []
        for s in slots:
            self.pinned[s] -= 1
            if self.pinned[s] <= 0:
                del self.pinned[s]
                if self.slots is not None and self.slots.owner_of(s) == PARKED:
                    done.append(s)
        if done:
            self.slots.release_slots(PARKED, done)
            self.note_free()

    def _park(self, owner: str) -> None:
        if self.pinned and self.slots is not None:
            keep = [s for s in self.slots.held(owner) if s in self.pinned]
            if keep:
                self.slots.transfer(owner, PARKED, keep)

    @contextlib.contextmanager
    def reading(self, req_id: str) -> Iterator[None]:
        """`req_id`'s slots are a storage read's target for as long as the block runs."""
        self.begin_io(req_id)
        try:
            yield
        finally:
            self.end_io(req_id)

    def begin_io(self, req_id: str) -> None:
        """A storage read or write targets `req_id`'s slots from now on (a release waits for `end_io`)."""
        self.busy[req_id] += 1

    def end_io(self, req_id: str) -> None:
        self.busy[req_id] -= 1
        if self.busy[req_id] > 0:
            return
        del self.busy[req_id]
        if req_id in self.free_later:
            self.free_later.discard(req_id)
            self.free(req_id)

    def note_free(self) -> None:
        if self.line is not None:
            self.line.note_free()
        if self.slots is not None:
            self.m_free.set(self.free_bytes())
