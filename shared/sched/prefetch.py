"""Tool-call prefetch: where and when to stage a session's stored KV, and what is staged."""
from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from shared.sched.policy.read_path import ReadPath, choose_path


@dataclass(frozen=True)
class Holder:
    """One buffer that may stage a prefetch: an engine's traffic-manager."""

    engine: Hashable
    node: Hashable
    role: str  # "prefill" | "decode"
    room_blocks: int  # prefetch budget left in its buffer, in blocks
    read_q: float  # its node's storage read queue (bytes): reads, prefetches in flight and lately sent (RecentBytes)
    read_rate: float = 0.0  # its node's storage-NIC read rate, bytes/s (0: unknown or uncapped)


@dataclass(frozen=True)
class Plan:
    engine: Hashable
    node: Hashable
    blocks: int  # leading stored blocks to stage (the budget may cut the tail)
    start_at: float
    side: ReadPath
    reason: str


def plan(blocks: int, block_bytes: int, now: float, return_at: float, holders: Iterable[Holder],
         margin: float = 2.0, lead_s: float = 0.1, unknown_rate_lead_s: float = 2.0, force: str = "auto",
         prefer_pe: bool = False) -> Plan | None:
    """Where and when to stage `blocks` stored blocks for a session due back at `return_at` (None: nothing
    to read or no room). `choose_path` picks the side, unless `force` ("pe" / "de") or `prefer_pe`
    (the prefill side whenever its read still ends `margin` times over before the session is due)."""
    if blocks <= 0:
        return None
    hs = list(holders)
    pe = _best(h for h in hs if h.role == "prefill") if force != "de" else None
    de = _best(h for h in hs if h.role == "decode") if force != "pe" else None
    if pe is None and de is None:
        return None
    if force in ("pe", "de"):
        why = f"read_path setting: {force.upper()} side only"
        side = ReadPath.PE if pe is not None else ReadPath.DE
    elif pe is not None and de is not None and prefer_pe and return_at - now >= _lead(
            pe, min(blocks, pe.room_blocks) * block_bytes, margin, lead_s, unknown_rate_lead_s):
        # a PE copies from its own TM's buffer; blocks on the DE side cost a claim round trip
        side = ReadPath.PE
        why = f"prefill side: its read ({pe.read_q:.0f} B queued) ends before the session is due"
    elif pe is not None and de is not None:
        side = choose_path(int(pe.read_q), int(de.read_q))
        why = f"idler storage NIC (prefill node {pe.read_q:.0f} B queued, decode node {de.read_q:.0f} B)"
    else:
        side = ReadPath.PE if pe is not None else ReadPath.DE
        why = "the only side with prefetch room"
    h = pe if side is ReadPath.PE else de
    assert h is not None  # the side chosen is one that has room
    n = min(blocks, h.room_blocks)
    lead = _lead(h, n * block_bytes, margin, lead_s, unknown_rate_lead_s)
    return Plan(h.engine, h.node, n, max(now, return_at - lead), side, why)


def _lead(h: Holder, nbytes: int, margin: float, lead_s: float, unknown_rate_lead_s: float) -> float:
    if h.read_rate > 0:
        return margin * (h.read_q + nbytes) / h.read_rate + lead_s
    return unknown_rate_lead_s


def _best(holders: Iterable[Holder]) -> Holder | None:
    room = [h for h in holders if h.room_blocks > 0]
    return min(room, key=lambda h: (h.read_q, -h.room_blocks, str(h.engine))) if room else None


@dataclass
class RecentBytes:
    """Prefetch bytes sent to each node lately, decaying with `half_life_s`: spreads them over idle queues."""

    half_life_s: float = 1.0
    _at: dict[Hashable, tuple[float, float]] = field(default_factory=dict)  # node -> (bytes, when)

    def add(self, node: Hashable, nbytes: float, now: float) -> None:
        self._at[node] = (self.get(node, now) + nbytes, now)

    def get(self, node: Hashable, now: float) -> float:
        b, t = self._at.get(node, (0.0, now))
        return b * math.exp2(-(now - t) / self.half_life_s) if self.half_life_s > 0 else 0.0


def hold_until(return_at: float, tool_s: float, grace_s: float, ttl_s: float | None = None) -> float:
    """When unclaimed staged blocks are released: return_at + max(grace_s, tool_s), never past the TTL."""
    until = return_at + max(grace_s, tool_s)
    return min(until, return_at - tool_s + ttl_s) if ttl_s is not None else until


@dataclass
class StagedSession:
    """Blocks staged in one buffer for one session (the traffic-manager's slots are named `owner`)."""

    owner: str
    engine: Hashable
    node: Hashable
    keys: list[bytes]  # the stored prefix staged, in prompt order
    until: float  # released then if nobody claimed it
    session: str = ""
    claimed_by: Hashable = None  # the request whose fetch uses it
    whole: bool = False  # `keys` are every block its turn persisted: the session stored nothing past them
    slots: object = None  # where its TM says they sit (`StagedSlots`): its own engine copies them directly
    pending: bool = False  # a finished turn's saved blocks its DE's buffer kept (maybe not yet written), no prefetch


@dataclass
class StagedIndex:
    by_owner: dict[str, StagedSession] = field(default_factory=dict)
    by_key: dict[bytes, list[str]] = field(default_factory=dict)  # every staged key -> the owners staging it
    held: dict[Hashable, int] = field(default_factory=dict)  # engine -> blocks staged in its buffer

    def add(self, s: StagedSession) -> None:
        if not s.keys:
            return
        self.remove(s.owner)
        self.by_owner[s.owner] = s
        for key in s.keys:
            self.by_key.setdefault(key, []).append(s.owner)
        self.held[s.engine] = self.held.get(s.engine, 0) + len(s.keys)

    def remove(self, owner: str) -> StagedSession | None:
        s = self.by_owner.pop(owner, None)
        if s is None:
            return None
        for key in s.keys:
            owners = self.by_key.get(key, [])
            if owner in owners:
                owners.remove(owner)
            if not owners:
                self.by_key.pop(key, None)
        left = self.held.get(s.engine, 0) - len(s.keys)
        if left > 0:
            self.held[s.engine] = left
        else:
            self.held.pop(s.engine, None)
        return s

    def match(self, keys: list[bytes]) -> StagedSession | None:
        """The unclaimed staged entry sharing the longest prefix with `keys` (`common` says how long)."""
        if not self.by_key:  # nothing staged anywhere: no walk over the prompt's keys
            return None
        for i in range(len(keys) - 1, -1, -1):
            for owner in self.by_key.get(keys[i], ()):
                s = self.by_owner[owner]
                if s.claimed_by is None and i < len(s.keys) and s.keys[i] == keys[i]:
                    return s
        return None

    def expired(self, now: float) -> list[StagedSession]:
        return [s for s in self.by_owner.values() if s.claimed_by is None and s.until <= now]

    def of_session(self, session: str) -> list[StagedSession]:
        return [s for s in self.by_owner.values() if session and s.session == session]

    def check_integrity(self) -> None:
        held: dict[Hashable, int] = {}
        for owner, s in self.by_owner.items():
            assert s.owner == owner and s.keys, (owner, s)
            held[s.engine] = held.get(s.engine, 0) + len(s.keys)
            assert all(owner in self.by_key.get(k, ()) for k in s.keys), owner
        assert held == self.held, (held, self.held)
        assert all(o in self.by_owner for owners in self.by_key.values() for o in owners)


def common(a: list[bytes], b: list[bytes]) -> int:
    """Leading keys two block-key lists share (chained hashes: equal at i means equal up to i)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
