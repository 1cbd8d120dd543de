"""A decode turn's saved blocks kept in the buffer for its next turn, written to the store or not.

They live under one staged entry of the prefetch path per request and, once `HoldSaves` names the
turn's keys, are claimed, released or dropped like any prefetch. A slot still being written is
pinned."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from services.traffic_manager.parts import TMParts
from services.traffic_manager.prefetch import Entry, PrefetchPath
from shared.bus import Delivery
from shared.messages.endpoints import EP
from shared.messages.traffic_manager import PENDING_OWNER, HoldSaves, Prefetched, SaveKV


async def install(parts: TMParts, prefetch: PrefetchPath, store_path) -> None:
    """Keep DE turns' saved blocks (`pending_hold_s` > 0); a save short of room takes theirs, not a
    prefetch's."""
    if parts.cfg.pending_hold_s <= 0:
        return
    store_path.pending = pend = PendingSaves(parts, prefetch, parts.cfg.pending_hold_s)
    store_path.line.reclaim = lambda n: prefetch.reclaim(n, pending_only=True)
    parts.pool.before_free = pend.take
    await parts.bus.subscribe(parts.subjects.at(EP.TM_HOLD, engine=parts.cfg.engine), pend.on_hold)


def owner_of(req_id: str) -> str:
    return PENDING_OWNER + req_id


@dataclass
class Pieces:
    prompt: list[int]  # slot ids of the prompt's full blocks, in order
    last_key: bytes  # the key of the prompt's last one (what the DE saved there)
    gen: dict[bytes, int] = field(default_factory=dict)  # a generated block's key -> its slot id


class PendingSaves:
    def __init__(self, parts: TMParts, prefetch: PrefetchPath, wait_s: float):
        self.p, self.prefetch, self.wait_s = parts, prefetch, wait_s  # wait_s: for the HoldSaves
        self.pieces: dict[str, Pieces] = {}  # owner -> what it holds
        self.flipped = False  # fault_flip_pending_bytes went in once
        self.waiting: dict[str, Pieces] = {}  # req_id -> its prompt's slots, taken when it frees them
        self.m_blocks = parts.metrics.counter("pending_saves_blocks_total",
                                              "Saved blocks kept in the buffer for a next turn, by outcome",
                                              ("outcome",))

    def _live(self, owner: str) -> Pieces | None:
        pc = self.pieces.get(owner)
        if pc is not None and owner not in self.prefetch.entries:  # dropped (pressure, TTL, release)
            del self.pieces[owner]
            return None
        return pc

    def keep_prompt(self, msg: SaveKV) -> None:
        """The DE claims its prompt's save: those blocks go to the request's entry once it lets its slots go."""
        pool = self.p.pool
        if not msg.slots or owner_of(msg.req_id) in self.prefetch.entries:
            return
        bn = pool.block_nbytes
        held = pool.slots.held(msg.req_id)
        offs = [s * bn for s in held]
        try:
            start = offs.index(msg.slots[0])
        except ValueError:
            return
        end = start + len(msg.slots)
        if offs[start:end] == list(msg.slots):
            self.waiting[msg.req_id] = Pieces(held[:end], msg.block_keys[-1])

    def take(self, req_id: str) -> None:
        pc = self.waiting.pop(req_id, None)
        if pc is None:
            return
        pool, owner = self.p.pool, owner_of(req_id)
        if any(pool.slots.owner_of(s) != req_id for s in pc.prompt):
            return
        pool.slots.transfer(req_id, owner, pc.prompt)
        self.prefetch.put(Entry(owner, time.monotonic() + self.wait_s, pending=True))
        self.pieces[owner] = pc
        self.m_blocks.labels("kept").inc(len(pc.prompt))

    def keep_generated(self, msg: SaveKV, save_owner: str) -> None:
        owner = owner_of(msg.req_id)
        pc = self._live(owner)
        if pc is None or len(msg.block_keys) != 1:
            return
        slots = self.p.pool.slots.held(save_owner)
        if len(slots) != 1:
            return
        self.p.pool.slots.transfer(save_owner, owner, slots)
        pc.gen[msg.block_keys[0]] = slots[0]
        self.m_blocks.labels("kept").inc()

    async def on_hold(self, msg: HoldSaves, d: Delivery) -> None:
        owner = owner_of(msg.req_id)
        pc, e = self._live(owner), self.prefetch.entries.get(owner)
        if not self.p.pool.ready or pc is None or e is None or e.keys or e.claimed_until:
            await d.respond(Prefetched(error="nothing kept for it"))
            return
        n_prompt = len(pc.prompt) if len(msg.block_keys) >= len(pc.prompt) and \
            msg.block_keys[len(pc.prompt) - 1] == pc.last_key else 0
        slots = list(pc.prompt[:n_prompt])
        if n_prompt == len(pc.prompt):
            for key in msg.block_keys[n_prompt:]:
                s = pc.gen.get(key)
                if s is None:
                    break
                slots.append(s)
        if not slots:
            self.prefetch.drop(owner, "miss")
            await d.respond(Prefetched(error="the turn's keys do not match what was kept"))
            return
        bn = self.p.pool.block_nbytes
        e.keys, e.slots = list(msg.block_keys[:len(slots)]), [s * bn for s in slots]
        e.until = time.monotonic() + msg.ttl_s
        del self.pieces[owner]
        if self.p.cfg.fault_flip_pending_bytes and not self.flipped:  # tests only: wrong bytes served once
            self.flipped = True
            flip_bytes(self.p.pool, e.slots[0])
        self.m_blocks.labels("offered").inc(len(slots))
        self.prefetch._note()
        await d.respond(Prefetched(len(slots), slots=self.prefetch._publish(e)))


def flip_bytes(pool, offset: int) -> None:
    """Fault injection (tests only): flip the top bit of every odd byte of the block's middle layer."""
    lay = pool.layout
    lb = lay.layer_block_nbytes
    start = offset + (lay.n_layers // 2) * lb
    import numpy as np

    np.frombuffer(pool.buffer.buf, dtype=np.uint8, count=lb, offset=start)[1::2] ^= 0x80
