"""The traffic-manager's prefetched blocks: a session's stored KV staged in spare buffer slots during its tool call.

A prefetch takes only spare slots and reads in the gateway's bulk lane a chunk at a time, so it
never delays a latency read. Entries are claimed, adopted or dropped (release, TTL, lease,
buffer pressure); a drop revokes the entry's stamp before its slots are freed."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from services.traffic_manager.parts import NOT_ATTACHED, TMParts
from services.traffic_manager.transfers import TransferKind
from services.traffic_manager.transfers import TransferState as T
from shared.bus import BusError, Delivery
from shared.messages.endpoints import EP
from shared.messages.storage_gateway import ReadBlocks
from shared.kv.staged_table import StagedTable
from shared.messages.traffic_manager import Claim, Claimed, Prefetch, Prefetched, Release
from shared.messages.work import StagedSlots

log = logging.getLogger("traffic_manager.prefetch")
SWEEP_S = 0.25  # how often expired entries are looked for (while there are any: no wake-ups otherwise)
CHUNK_S = 0.01  # a bulk read holds a rate-capped storage NIC this long at most
CLAIM_LEASE_TIMEOUTS = 10  # a claim outlives its claimer's silence by this many transfer deadlines
DROPPED = {"used": T.DONE, "miss": T.FAILED, "released": T.RELEASED, "pressure": T.RELEASED, "ttl": T.EXPIRED,
           "lease": T.EXPIRED}  # why an entry was dropped -> the state its transfer ends in (else FAILED)


@dataclass
class Entry:
    owner: str
    until: float  # monotonic: dropped then unless claimed
    keys: list[bytes] = field(default_factory=list)  # staged so far, read and verified
    slots: list[int] = field(default_factory=list)  # their buffer offsets
    claimed_until: float = 0.0  # > 0: a fetch copies from it (pinned until released, or this lease ends)
    record: int = -1  # its stamp's record in the stamp table (-1: not published)
    pending: bool = False  # a turn's saved blocks kept for the next turn (pending.py), not a prefetch
    state: T | None = None  # its transfer state (written by `Transfers` alone)

    @property
    def kind(self) -> TransferKind:
        return TransferKind.KEPT if self.pending else TransferKind.PREFETCH

    @property
    def req_id(self) -> str:
        return self.owner


class PrefetchPath:
    def __init__(self, parts: TMParts, chunk_blocks: int, share: float, table: StagedTable | None = None):
        self.p, self.chunk, self.share = parts, max(1, chunk_blocks), share
        self.entries: dict[str, Entry] = {}
        self.added = asyncio.Event()  # an entry was added: the sweep, idle while there were none, starts again
        self.table = table  # the stamps this TM's own engine checks (staged_table.py); None: never published
        m = parts.metrics
        self.m_staged = m.gauge("prefetch_staged_bytes", "Buffer bytes holding prefetched blocks (read, unreleased)")
        self.m_blocks = m.counter("prefetch_blocks_total", "Prefetched blocks by outcome", ("outcome",))

    # budget ------------------------------------------------------------------------------
    def staged_slots(self) -> int:
        pool = self.p.pool
        return sum(len(pool.slots.held(o)) for o, e in self.entries.items() if not e.pending) if pool.slots else 0

    def room_bytes(self) -> int:
        """What a new prefetch may take now: the budget left, within the spare slots."""
        pool = self.p.pool
        if not pool.ready:
            return 0
        budget = int(self.share * pool.slots.n_slots) - self.staged_slots()
        return max(0, min(budget, pool.spare())) * pool.block_nbytes

    # stage --------------------------------------------------------------------------------
    async def on_prefetch(self, msg: Prefetch, d: Delivery) -> None:
        if not self.p.pool.ready:
            await d.respond(Prefetched(error=NOT_ATTACHED))
            return
        self.p.spawn(self.prefetch(msg, d), name=f"prefetch-{msg.owner}", on_error=lambda exc: d.respond(
            Prefetched(error=exc.reason if isinstance(exc, BusError) else f"{type(exc).__name__}: {exc}")))

    async def prefetch(self, msg: Prefetch, d: Delivery) -> None:
        p, pool = self.p, self.p.pool
        bn = pool.block_nbytes
        n = min(len(msg.block_keys), self.room_bytes() // bn if bn else 0)
        why = "released before it was staged" if msg.owner in pool.cancelled else \
            "already staged" if msg.owner in self.entries else "no prefetch room in the buffer" if n <= 0 else ""
        if why:
            await d.respond(Prefetched(error=why))
            return
        offsets = [s * bn for s in pool.slots.allocate(msg.owner, n)]  # spare slots: nobody waits for them
        e = self.put(Entry(msg.owner, time.monotonic() + msg.ttl_s))
        self._note()
        error = ""
        try:
            while len(e.keys) < n and self.entries.get(msg.owner) is e and not e.claimed_until:
                got = await self._chunk(msg, e, offsets)
                if got < 0:
                    break
        except BusError as exc:
            error = exc.reason
        staged = len(e.keys) if self.entries.get(msg.owner) is e else 0
        if staged == 0:
            self.drop(msg.owner, "miss")
        elif e.state is T.READING:
            self.p.xfers.move(e, T.STAGED)
        self.m_blocks.labels("staged").inc(staged)
        p.m_bytes.labels("prefetch_stage").inc(staged * bn)
        await d.respond(Prefetched(staged, error, slots=self._publish(e) if staged else None))

    def _publish(self, e: Entry) -> StagedSlots | None:
        got = self.table.publish() if self.table is not None and not e.claimed_until else None
        if got is None:
            return None
        e.record, stamp = got
        return StagedSlots(self.p.pool.buffer.name, self.table.name, e.record, stamp, list(e.slots))

    async def _chunk(self, msg: Prefetch, e: Entry, offsets: list[int]) -> int:
        """Read the next chunk; returns blocks read, -1 when the chain stopped."""
        p, pool = self.p, self.p.pool
        i = len(e.keys)
        end = min(i + self._chunk_blocks(msg.node), len(offsets))  # the slots the budget gave, not every key
        keys, offs = msg.block_keys[i:end], offsets[i:end]
        nbytes = len(keys) * pool.block_nbytes
        wait = max(0.0, e.until - time.monotonic())  # a chunk that cannot start before the TTL is not read
        with pool.reading(msg.owner), p.queues.read_at(msg.node, nbytes):
            done = await p.bus.request(
                p.subjects.at(EP.SG_READ, node=msg.node),
                ReadBlocks(msg.owner, msg.layout, keys, pool.buffer.name, offs, bulk=True, start_within_s=wait),
                timeout=wait + p.queues.deadline(msg.node, nbytes))
        if self.entries.get(msg.owner) is e:  # not dropped meanwhile
            e.keys += keys[:done.blocks]
            e.slots += offs[:done.blocks]
            self._note()
        return done.blocks if done.blocks == len(keys) else -1

    def _chunk_blocks(self, node: str) -> int:
        """Blocks per bulk read: no more than CHUNK_S of the node's storage NIC when its rate is known."""
        g = self.p.queues.gateways.get(node)
        rate, bn = (g.read_bytes_per_s if g else 0.0), self.p.pool.block_nbytes
        return max(1, min(self.chunk, int(rate * CHUNK_S / bn))) if rate > 0 and bn else self.chunk

    # claim / drop -----------------------------------------------------------------------------
    def claim(self, owner: str, keys: list[bytes]) -> list[int]:
        """Offsets of the leading `keys` staged under `owner` (pinned from now on); [] when gone."""
        e = self.entries.get(owner)
        if e is None:
            return []
        n = 0
        while n < min(len(keys), len(e.keys)) and keys[n] == e.keys[n]:
            n += 1
        e.claimed_until = time.monotonic() + CLAIM_LEASE_TIMEOUTS * self.p.cfg.transfer_timeout_s
        self.p.xfers.move(e, T.CLAIMED)
        self.m_blocks.labels("claimed").inc(n)
        return e.slots[:n]

    def adopt(self, owner: str, keys: list[bytes], req_id: str) -> list[int]:
        """The leading staged blocks matching `keys` become `req_id`'s own slots; the entry goes."""
        slots = self.claim(owner, keys)
        self._revoke(self.entries.get(owner))  # the slots change hands: no direct copy from now on
        if slots:
            bn = self.p.pool.block_nbytes
            self.p.pool.slots.transfer(owner, req_id, [off // bn for off in slots])
            self.m_blocks.labels("adopted").inc(len(slots))
        self.drop(owner, "used")
        return slots

    async def on_claim(self, msg: Claim, d: Delivery) -> None:
        """Another TM claims: the slots and a grant of exactly them, ended when the slots are freed."""
        slots = self.claim(msg.owner, msg.block_keys)
        grant = self.p.given.give(msg.owner, slots, self.p.pool.block_nbytes) if slots else b""
        await d.respond(Claimed(slots=slots, grant=grant))

    def used(self, msg: Release) -> bool:
        if msg.req_id not in self.entries:
            return False
        self.m_blocks.labels("claimed").inc(msg.used)
        self.p.m_bytes.labels("prefetch_used").inc(msg.used * self.p.pool.block_nbytes)
        return self.drop(msg.req_id, "used")

    def drop(self, owner: str, why: str) -> bool:
        """Free `owner`'s slots (once the read targeting them ends); False: not staged here."""
        e = self.entries.pop(owner, None)
        if e is None:
            return False
        self.p.xfers.end(e, DROPPED.get(why, T.FAILED), why)
        self._revoke(e)  # before the slots are free: a copy under way sees it gone once it ends
        if why not in ("used", "miss"):
            self.m_blocks.labels(f"dropped_{why}").inc(len(e.keys))
        self.p.pool.free(owner)
        self._note()
        return True

    def reclaim(self, n: int, pending_only: bool = False) -> None:
        """A reservation needs `n` more slots: drop unclaimed entries, the one due back last first."""
        pool = self.p.pool
        for e in sorted((e for e in self.entries.values() if not e.claimed_until and (e.pending or not pending_only)),
                        key=lambda e: -e.until):
            if n <= 0:
                return
            n -= len(pool.slots.held(e.owner))
            self.drop(e.owner, "pressure")

    def reset(self) -> None:
        if self.table is not None:
            self.table.clear()
        for e in self.entries.values():
            self.p.xfers.end(e, T.FAILED, "the buffer was cut anew")
        self.entries.clear()
        self._note()

    def put(self, e: Entry) -> Entry:
        """Hold `e` (a prefetch or a kept turn) and restart the expiry sweep."""
        old = self.entries.get(e.owner)
        if old is not None and old is not e:
            self.p.xfers.end(old, T.FAILED, "replaced")
        self.entries[e.owner] = e
        self.p.xfers.enter(e, T.STAGED if e.pending else T.READING)
        self.added.set()
        return e

    def expire(self, now: float) -> None:
        """Drop unclaimed entries past their TTL and claimed ones past their lease."""
        for e in list(self.entries.values()):
            if (e.claimed_until or e.until) <= now:
                self.drop(e.owner, "lease" if e.claimed_until else "ttl")

    async def sweep(self) -> None:
        while True:
            if not self.entries:  # nothing can expire: sleep until something is staged
                self.added.clear()
                await self.added.wait()
            await asyncio.sleep(SWEEP_S)
            self.expire(time.monotonic())

    def staged_bytes(self) -> int:
        return sum(len(e.keys) for e in self.entries.values() if not e.pending) * self.p.pool.block_nbytes

    def _revoke(self, e: Entry | None) -> None:
        if e is not None and e.record >= 0:
            self.table.revoke(e.record)
            e.record = -1

    def _note(self) -> None:
        self.m_staged.set(self.staged_bytes())
