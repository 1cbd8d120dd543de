"""Agent sessions at the scheduler: retention hints to the store, prefetch during tool calls, release.

A turn's end sets retention and plans a prefetch; an arriving turn claims what was staged, or
cancels a prefetch not started. Unclaimed blocks go back at their TTL. The policy is
`shared.sched.prefetch`."""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from dataclasses import replace

from opentelemetry import trace

from services.scheduler.inflight import InFlight
from shared.bus import BusError
from shared.engine.store_layout import prompt_keys
from shared.messages.codes import LoadMode
from shared.messages.endpoints import EP
from shared.messages.front import Hint, Reuse
from shared.messages.storage_gateway import HitQuery, Retain, RetainLevel
from shared.messages.traffic_manager import PENDING_OWNER, HoldSaves, Prefetch, Prefetched, Release
from shared.sched.policy.read_path import ReadPath
from shared.sched.prefetch import Holder, RecentBytes, StagedIndex, StagedSession, common, hold_until, plan

log = logging.getLogger("scheduler.prefetch")
tracer = trace.get_tracer("scheduler")
SWEEP_S = 0.5
PERSIST_POLLS, PERSIST_POLL_S = 10, 0.05  # how long a prefetch waits for the turn's last blocks to be stored


class Prefetcher:
    def __init__(self, bus, subjects, view, reads, cfg, spawn, ask_hits, metrics):
        self.bus, self.subjects, self.view, self.reads, self.cfg = bus, subjects, view, reads, cfg
        self.spawn, self.ask_hits = spawn, ask_hits
        self.index = StagedIndex()
        self.added = asyncio.Event()  # something was staged: the sweep, idle while nothing was, starts again
        self.planned: dict[bytes, asyncio.Task] = {}  # last key of a prefetch not started yet -> its task
        self.sending: Counter = Counter()  # engine -> blocks asked of it, not answered yet
        self.bulk: Counter = Counter()  # node -> prefetch bytes asked of its gateway, not answered yet
        self.recent = RecentBytes()  # node -> prefetch bytes sent lately (spreads prefetches over idle NICs)
        self.m_blocks = metrics.counter("prefetch_blocks_total", "Prefetched blocks by outcome", ("outcome",))
        self.m_staged = metrics.gauge("prefetch_staged_blocks", "Blocks staged in buffers for agent sessions")

    # an arriving turn -------------------------------------------------------------------------
    def arrive(self, rec: InFlight) -> None:
        """Claim the longest staged prefix of the turn's prompt; cancel a prefetch it overtook."""
        if not rec.block_keys or not rec.mode.moves_kv:
            return
        for key in rec.block_keys if self.planned else ():  # (no walk over the prompt's keys while none is planned)
            task = self.planned.pop(key, None)
            if task is not None:  # came back before its prefetch started: read at arrival
                task.cancel()
                self.m_blocks.labels("overtaken").inc()
        s = self.index.match(rec.block_keys)
        if s is not None:
            s.claimed_by = rec.req_id
            rec.staged = s
        session = rec.hint.session if rec.hint is not None else ""
        for other in self.index.of_session(session):  # the session came back on another prefix
            if other is not s and other.claimed_by is None:
                self._release(other, "diverged")

    def stored_prefix(self, keys: list[bytes]) -> int:
        """Leading `keys` known stored without asking a gateway (0: ask): a session's staged turn."""
        s = self.index.match(keys)
        if s is None or s.pending or not s.whole or common(s.keys, keys) < len(s.keys):
            return 0
        return len(s.keys)

    def sources(self, mode: LoadMode) -> tuple:
        return (self.stored_prefix if mode.moves_kv else None), self.buffered

    def buffered(self, keys: list[bytes]) -> int:
        """Leading `keys` a finished turn's DE keeps in its buffer: hits, counted with the store's."""
        s = self.index.match(keys)
        return common(s.keys, keys) if s is not None and s.pending else 0

    # a finished turn ---------------------------------------------------------------------------
    def done(self, rec: InFlight, status: str) -> None:
        if rec.staged is not None:  # its fetch released the slots already; this covers a fetch that never ran
            self._release(rec.staged, "claimed")
            rec.staged = None
        h, layout = rec.hint, self.view.store_layout()
        if layout is not None and rec.mode.moves_kv and status == "ok" and rec.tokens and rec.de and \
                self.cfg.serve_pending_saves and not (h is not None and (h.release or h.prefetch and self.cfg.prefetch)):
            self.spawn(self._hold(rec, prompt_keys(layout, rec.prompt + rec.tokens[:-1]), h.session if h else ""),
                       name=f"hold-{rec.req_id}")
        if h is None or layout is None or not rec.mode.moves_kv:
            return
        if h.release:
            self.end_session(h.session, layout)
            return
        if status != "ok" or not rec.tokens:
            return
        keys = prompt_keys(layout, rec.prompt + rec.tokens[:-1])  # what decode persists: prompt + generated KV
        self._retain(h, keys, layout)
        if h.prefetch and self.cfg.prefetch and keys:
            owner = f"pf-{uuid.uuid4().hex[:12]}"
            return_at = time.monotonic() + h.tool_s
            self.planned[keys[-1]] = self.spawn(self._prefetch(owner, h, keys, layout, return_at, rec.mode),
                                                name=f"prefetch-{owner}")

    def end_session(self, session: str, layout) -> None:
        """The session is over: its retention ends, what was staged for it goes back."""
        for s in self.index.of_session(session):
            if s.claimed_by is None:
                self._release(s, "released")
        if session and layout is not None:
            self.spawn(self.bus.publish(self.subjects.at(EP.SG_RETAIN), Retain(layout, session, release=True)),
                       name=f"release-{session[:32]}")

    async def close_session(self, session: str) -> None:
        self.end_session(session, self.view.store_layout())

    def _retain(self, h: Hint, keys: list[bytes], layout) -> None:
        ttl = h.retain_s(self.cfg.hint_ttl_s)
        level = RetainLevel.RETAINED
        if h.reuse == Reuse.NONE:
            ttl, level = h.ttl_s or self.cfg.hint_ttl_s, RetainLevel.DEMOTED
        if ttl:
            msg = Retain(layout, h.session, keys, level, ttl)
            self.spawn(self.bus.publish(self.subjects.at(EP.SG_RETAIN), msg), name="retain")

    # the prefetch ----------------------------------------------------------------------------------
    async def _prefetch(self, owner: str, h: Hint, keys: list[bytes], layout, return_at: float,
                        mode: LoadMode) -> None:
        try:
            first = self._plan(len(keys), return_at, mode)
            if first is None:
                self.m_blocks.labels("no_room").inc(len(keys))
                return
            await asyncio.sleep(max(0.0, first.start_at - time.monotonic()))
        finally:  # started (or given up): an arriving turn no longer cancels it
            if self.planned.get(keys[-1]) is asyncio.current_task():
                del self.planned[keys[-1]]
        stored = await self._stored(keys, layout, return_at)
        p = self._plan(stored, return_at, mode, keep=first.side)
        if p is None:
            self.m_blocks.labels("no_room").inc(stored)
            return
        now = time.monotonic()
        s = StagedSession(owner, p.engine, p.node, keys[:p.blocks],
                          hold_until(return_at, h.tool_s, self.cfg.prefetch_grace_s, h.ttl_s), h.session,
                          whole=p.blocks == len(keys))
        self._stage(s)  # claimable at once: an early turn takes what is staged by then
        nbytes = p.blocks * self._block_bytes()
        self.sending[p.engine] += p.blocks
        self.bulk[p.node] += nbytes
        self.recent.add(p.node, nbytes, now)
        with tracer.start_as_current_span("prefetch", attributes={
                "owner": owner, "session": h.session, "engine": p.engine, "node": p.node, "blocks": p.blocks,
                "stored_blocks": stored, "side": p.side.name.lower(), "reason": p.reason,
                "due_in_s": round(return_at - now, 3)}) as span:
            try:
                got = await self.bus.request(self.subjects.at(EP.TM_PREFETCH, engine=p.engine),
                                             Prefetch(owner, s.keys, p.node, layout, s.until - now),
                                             timeout=max(1.0, s.until - now))
            except BusError as exc:
                got = Prefetched(error=exc.reason)
            finally:
                self.sending[p.engine] -= p.blocks
                self.bulk[p.node] -= nbytes
            span.set_attributes({"staged_blocks": got.blocks, "error": got.error})
        self.m_blocks.labels("staged").inc(got.blocks)
        if self.index.by_owner.get(owner) is s and s.claimed_by is None:
            self.index.remove(owner)
            if got.blocks:
                s.whole = s.whole and got.blocks >= len(s.keys)
                s.keys = s.keys[:got.blocks]
                s.slots = got.slots if got.slots is not None and len(got.slots.slots) == got.blocks else None
                self._stage(s)
        self._note()

    async def _hold(self, rec: InFlight, keys: list[bytes], session: str) -> None:
        ttl, de = self.cfg.pending_ttl_s, rec.de
        if not keys:
            return
        try:
            got = await self.bus.request(self.subjects.at(EP.TM_HOLD, engine=de),
                                         HoldSaves(rec.wire_id, keys, ttl + SWEEP_S), timeout=5.0)
        except BusError:
            return
        if got.blocks:
            self._stage(StagedSession(PENDING_OWNER + rec.wire_id, de, self.view.node_of(de), keys[:got.blocks],
                               time.monotonic() + ttl, session, whole=got.blocks == len(keys), slots=got.slots,
                               pending=True))
            self.m_blocks.labels("pending").inc(got.blocks)
            self._note()

    async def _stored(self, keys: list[bytes], layout, return_at: float) -> int:
        """How many of `keys` are stored, after a short wait for the turn's last saves."""
        stored = 0
        for _ in range(PERSIST_POLLS):
            try:
                stored = (await self.ask_hits(HitQuery(layout, keys))).blocks
            except BusError:
                return stored
            if stored >= len(keys) or time.monotonic() + PERSIST_POLL_S >= return_at:
                return stored
            await asyncio.sleep(PERSIST_POLL_S)
        return stored

    def _plan(self, blocks: int, return_at: float, mode: LoadMode, keep: ReadPath | None = None):
        """The same path policy as a hit's read; a prefill-side plan (`keep`) stays while that side has
        room."""
        bb = self._block_bytes()
        force = self.cfg.read_path if LoadMode(mode).both_paths else "pe"
        holders, now, prefer = self._holders(bb), time.monotonic(), self.cfg.prefetch_prefer_pe
        if keep is ReadPath.PE and prefer and force == "auto":
            p = plan(blocks, bb, now, return_at, holders, self.cfg.prefetch_margin, force="pe")
            if p is not None:
                return replace(p, reason="prefill side, as planned when the turn ended")
        return plan(blocks, bb, now, return_at, holders, self.cfg.prefetch_margin, force=force, prefer_pe=prefer)

    def _holders(self, block_bytes: int) -> list[Holder]:
        now, out = time.monotonic(), []
        layout = self.view.store_layout()
        bs = layout.block_size if layout else 64
        for role in ("prefill", "decode"):
            for eng in self.view.assignable(role, now):
                tm = self.view.tms[eng.engine].msg
                gw = self.view.gateways.get(eng.node)
                gw_q = gw.msg.read_q_bytes if gw else 0
                rate = gw.msg.read_bytes_per_s if gw else 0.0
                queued = self.reads.pending.get(eng.node, 0) * block_bytes / bs + gw_q + self.bulk[eng.node] + \
                    self.recent.get(eng.node, now)
                room = tm.prefetch_room_bytes // block_bytes - self.sending[eng.engine] if block_bytes else 0
                out.append(Holder(eng.engine, eng.node, role, room, queued, rate))
        return out

    def _block_bytes(self) -> int:
        for seen in self.view.engines.values():
            if seen.msg.kv is not None:
                return seen.msg.kv.block_nbytes
        return 0

    # expiry and release --------------------------------------------------------------------------
    def _stage(self, s: StagedSession) -> None:
        """Index `s` and restart the expiry sweep."""
        self.index.add(s)
        self.added.set()

    async def sweep(self) -> None:
        while True:
            if not self.index.by_owner:  # nothing can expire: sleep until something is staged
                self.added.clear()
                await self.added.wait()
            await asyncio.sleep(SWEEP_S)
            for s in self.index.expired(time.monotonic()):
                self._release(s, "expired")

    def _release(self, s: StagedSession, outcome: str) -> None:
        if self.index.by_owner.get(s.owner) is s:
            self.index.remove(s.owner)
        self.m_blocks.labels(outcome).inc(len(s.keys))
        self.spawn(self.bus.publish(self.subjects.at(EP.TM_RELEASE, engine=s.engine), Release(s.owner)),
                   name=f"release-{s.owner}")
        self._note()

    def _note(self) -> None:
        self.m_staged.set(sum(self.index.held.values()))
