"""Fixed-size slot allocation with ownership: KV blocks in an engine, buffer slots in a TM."""
from __future__ import annotations

from collections import defaultdict


class OutOfSlots(Exception):
    """Not enough free slots: `wanted` asked for, `free` available."""

    def __init__(self, wanted: int, free: int):
        super().__init__(f"wanted {wanted} slots, {free} free")
        self.wanted, self.free = wanted, free


class SlotAllocator:
    def __init__(self, n_slots: int):
        if n_slots <= 0:
            raise ValueError(f"n_slots must be positive, got {n_slots}")
        self.n_slots = n_slots
        self._free: list[int] = list(range(n_slots - 1, -1, -1))  # pop() gives low ids first
        self._owner: dict[int, str] = {}
        self._held: dict[str, list[int]] = defaultdict(list)

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.n_slots - len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, owner: str, n: int) -> list[int]:
        if n < 0:
            raise ValueError(f"cannot allocate {n} slots")
        if n > len(self._free):
            raise OutOfSlots(n, len(self._free))
        slots = [self._free.pop() for _ in range(n)]
        for s in slots:
            self._owner[s] = owner
        if slots:  # an owner holding nothing is not listed by owners()
            self._held[owner].extend(slots)
        return slots

    def held(self, owner: str) -> list[int]:
        return list(self._held.get(owner, ()))

    def owners(self) -> list[str]:
        return list(self._held)

    def transfer(self, src: str, dst: str, slots: list[int]) -> None:
        """Hand `slots` (held by `src`) to `dst`, in that order after what `dst` holds already."""
        held = self._held.get(src, [])
        for s in slots:
            if self._owner.get(s) != src:
                raise ValueError(f"slot {s} is not held by {src!r}")
            self._owner[s] = dst
            held.remove(s)
        self._held[dst].extend(slots)
        if not held:
            self._held.pop(src, None)

    def owner_of(self, slot: int) -> str | None:
        return self._owner.get(slot)

    def release_slots(self, owner: str, slots: list[int]) -> None:
        self.transfer(owner, "\0release", slots)
        self.release("\0release")

    def release(self, owner: str) -> int:
        """Free every slot `owner` holds; returns how many (0 if none: idempotent)."""
        slots = self._held.pop(owner, [])
        for s in slots:
            del self._owner[s]
        self._free.extend(reversed(slots))
        return len(slots)

    def check_integrity(self) -> None:
        free = set(self._free)
        assert len(free) == len(self._free), "slot freed twice"
        assert not (free & self._owner.keys()), "slot both free and owned"
        assert len(free) + len(self._owner) == self.n_slots, "slot lost"
        held = [s for slots in self._held.values() for s in slots]
        assert sorted(held) == sorted(self._owner), "owner map out of sync"
