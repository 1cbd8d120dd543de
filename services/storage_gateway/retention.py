"""Retention marks on stored blocks: which are evicted first, which last, from agents' hints.

Demoted blocks go first, then ordinary ones by LRU, retained ones last; the capacity limit still
holds. Marks expire on their own. Pure bookkeeping under the store's lock."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from shared.messages.storage_gateway import RetainLevel as Level


@dataclass(slots=True)
class Mark:
    level: Level
    until: float  # wall-clock time the mark ends
    session: str


class Retention:
    def __init__(self) -> None:
        self._marks: dict[bytes, Mark] = {}
        self._sessions: dict[str, set[bytes]] = {}
        self._demoted = 0  # marks at DEMOTED (the eviction scan looks for them first only when some exist)
        self._swept = 0  # marks after the last sweep

    def __len__(self) -> int:
        return len(self._marks)

    def mark(self, keys: Iterable[bytes], level: Level, ttl_s: float, session: str, now: float) -> int:
        """Mark `keys` for `ttl_s` (another session never lowers a retained mark); returns the marks
        held."""
        until = now + ttl_s
        for key in keys:
            old = self._marks.get(key)
            if old is not None and old.until > now and old.level > level and old.session != session:
                continue  # someone else still retains it (a shared prefix)
            self._set(key, Mark(level, until, session))
        if len(self._marks) > 2 * max(self._swept, 1024):
            self.sweep(now)
        return len(self._marks)

    def release(self, session: str) -> int:
        keys = self._sessions.pop(session, set())
        n = 0
        for key in keys:
            m = self._marks.get(key)
            if m is not None and m.session == session:
                self._drop(key)
                n += 1
        return n

    def level(self, key: bytes, now: float) -> Level:
        m = self._marks.get(key)
        if m is None:
            return Level.NORMAL
        if m.until <= now:
            self._drop(key)
            return Level.NORMAL
        return m.level

    def sweep(self, now: float) -> None:
        for key in [k for k, m in self._marks.items() if m.until <= now]:
            self._drop(key)
        self._swept = len(self._marks)

    def victim(self, oldest_first: Iterable[bytes], pinned: Callable[[bytes], bool], now: float) -> bytes | None:
        """The next block to evict in LRU order, skipping pinned ones; stops at the first ordinary block."""
        normal = retained = None
        for k in oldest_first:
            if pinned(k):
                continue
            level = self.level(k, now) if self._marks else Level.NORMAL
            if level == Level.DEMOTED:
                return k
            if level == Level.NORMAL:
                normal = k if normal is None else normal
                if not self._demoted:  # (the demoted marks seen so far may just have expired)
                    return normal
            elif retained is None:
                retained = k
        return normal if normal is not None else retained  # only retained left: the capacity still holds

    def check_integrity(self) -> None:
        assert self._demoted == sum(1 for m in self._marks.values() if m.level == Level.DEMOTED)
        for key, m in self._marks.items():
            assert key in self._sessions.get(m.session, ()), (key, m.session)

    # internals ------------------------------------------------------------------------
    def _set(self, key: bytes, m: Mark) -> None:
        if key in self._marks:
            self._drop(key)
        self._marks[key] = m
        self._sessions.setdefault(m.session, set()).add(key)
        self._demoted += m.level == Level.DEMOTED

    def _drop(self, key: bytes) -> None:
        m = self._marks.pop(key)
        self._demoted -= m.level == Level.DEMOTED
        keys = self._sessions.get(m.session)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._sessions[m.session]
