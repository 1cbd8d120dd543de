"""An emulated prefill engine: the real engine's bus protocol, its compute replaced by waiting.

Forwards are planned by the real intra-PE policy and timed by `FleetTiming`; the hand-off is a
real `DecodeAdmit`. Messages the scheduler never sees are left out.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from dualpath.fleet.store import StoreIndex, generated_token
from dualpath.fleet.timing import FleetTiming
from shared.bus import Bus, BusError, Delivery
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.endpoints import EP
from shared.messages.plan import Source, loaded
from shared.messages.registry import EngineAnnounce, KVRegion
from shared.messages.storage_gateway import StoreLayout
from shared.messages.stream import TokenEvent
from shared.messages.subjects import Subjects
from shared.messages.work import Ack, DecodeAdmit, PrefillWork
from shared.sched.policy.intra_pe import ReadyPrefill as Work, plan_batch


class EngineHost(Protocol):
    """What an emulated engine needs from its emulator process."""

    bus: Bus
    subjects: Subjects
    timing: FleetTiming
    layout: StoreLayout
    store: StoreIndex
    quota_s: float
    max_context: int

    def read_done_at(self, node: str, tokens: int, now: float) -> float: ...
    def note_work(self, req_id: str) -> None: ...
    def spawn(self, coro) -> asyncio.Task: ...


@dataclass(eq=False)
class Prompt:
    work: PrefillWork
    done: int = 0  # prompt tokens whose KV is in memory (hits, then computed chunks)
    cancelled: bool = False

    @property
    def tokens(self) -> int:
        return len(self.work.prompt)


class PrefillEngine:
    role = "prefill"

    def __init__(self, host: EngineHost, engine: str, node: str, instance: str, kv_blocks: int = 16384):
        self.host, self.engine, self.node, self.instance = host, engine, node, instance
        bs = host.layout.block_size
        self.kv = KVRegion(f"dp-pe-kv-{engine}", kv_blocks, bs, host.layout.n_layers,
                           bs * host.timing.model.kv_bytes, bs * host.timing.model.kv_bytes // host.layout.n_layers)
        self.held: dict[str, Prompt] = {}
        self.queue: deque[Prompt] = deque()
        self.wake = asyncio.Event()
        self.forwards = 0

    def announce(self) -> EngineAnnounce:
        tok = sum(p.tokens for p in self.held.values())
        used = -(-tok // self.kv.block_size)
        return EngineAnnounce(instance=self.instance, node=self.node, metrics_url="", pid=0, engine=self.engine,
                              role=self.role, group=self.node, model_id=self.host.layout.model_id,
                              max_context=self.host.max_context, seq=len(self.held), tok=tok,
                              free_blocks=max(0, self.kv.num_blocks - used), total_blocks=self.kv.num_blocks,
                              kv=self.kv, store=self.host.layout)

    async def on_work(self, msg: PrefillWork, d: Delivery) -> None:
        self.host.note_work(msg.req_id)
        if len(msg.prompt) > self.host.max_context:
            await self._error(msg, ErrorCode.PROMPT_TOO_LONG, "prompt longer than the engine's KV memory")
            return
        bs = self.host.layout.block_size
        p = Prompt(msg)
        self.held[msg.req_id] = p
        plan = msg.plan
        hits = min(loaded(plan), len(msg.block_keys), (len(msg.prompt) - 1) // bs)
        if not hits or any(r.source == Source.PRESENT for r in plan.ranges):
            p.done = hits * bs
            self._ready(p)
            return
        now = time.monotonic()
        de = _de_path(msg)
        pe_blocks = max(0, min(hits, de.start if de else hits))  # buffered blocks count as PE-path reads here
        pe = next((r for r in plan.ranges if r.source == Source.STORE and r.engine != msg.de_engine), None)
        at = now
        if pe_blocks:
            at = self.host.read_done_at(pe.node if pe and pe.node else self.node, pe_blocks * bs, now)
        if hits > pe_blocks:  # DE path: the DE node's gateway reads, its compute NIC forwards
            at = max(at, self.host.read_done_at(de.node, (hits - pe_blocks) * bs, now))
        p.done = hits * bs
        asyncio.get_running_loop().call_later(at - now, self._ready, p)

    def _ready(self, p: Prompt) -> None:
        if not p.cancelled:
            self.queue.append(p)
            self.wake.set()

    def cancel(self, req_id: str) -> None:
        p = self.held.pop(req_id, None)
        if p is not None:
            p.cancelled = True

    async def run(self) -> None:
        timing, quota = self.host.timing, self.host.quota_s
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.queue:
                while self.queue and self.queue[0].cancelled:
                    self.queue.popleft()
                ready = [p for p in self.queue if not p.cancelled]
                if not ready:
                    self.queue.clear()
                    break
                chunks = plan_batch((Work(i, p.done, p.tokens - p.done) for i, p in enumerate(ready)),
                                    timing.attention, quota, align=self.host.layout.block_size)
                await asyncio.sleep(timing.prefill_s([(c.cached, c.bsz) for c in chunks]))
                self.forwards += 1
                for c in chunks:
                    p = ready[c.rid]
                    p.done = c.cached + c.bsz
                    if p.done >= p.tokens:
                        self.queue.remove(p)
                        if not p.cancelled:
                            self.host.spawn(self._handoff(p))

    async def _handoff(self, p: Prompt) -> None:
        """First token out, then the KV's transfer time, then the admission at the decode engine."""
        w = p.work
        first = generated_token(w.prompt[0], len(w.prompt))
        done = w.sampling.max_tokens <= 1
        hit_tokens = min(w.plan.stored * self.host.layout.block_size, len(w.prompt) - 1)
        bus = self.host.bus
        await bus.publish(w.reply, TokenEvent(w.req_id, [first], 0, finish=FinishReason.LENGTH if done else None,
                                              source=self.engine, cached_tokens=hit_tokens))
        try:
            if done or p.cancelled:
                return
            de = _de_path(w)
            de_hits = de.end - de.start if de else 0
            sent = len(w.prompt) - de_hits * self.host.layout.block_size
            if w.plan.push:
                await asyncio.sleep(self.host.timing.transfer_s(max(0, sent)))
            n_blocks = -(-len(w.prompt) // self.host.layout.block_size) if w.plan.push else 0
            admit = DecodeAdmit(w.req_id, len(w.prompt), first, w.sampling, w.reply, list(range(n_blocks)),
                                pe_engine=self.engine, prompt=w.prompt, block_keys=w.block_keys,
                                persisted_blocks=w.plan.stored, persist=w.plan.persist)
            try:
                ack = await bus.request(self.host.subjects.at(EP.DE_ADMIT, engine=w.de_engine), admit, timeout=30.0)
            except BusError as exc:
                ack = Ack(False, exc.reason, ErrorCode.KV_TRANSFER)
            if not ack.ok and not p.cancelled:
                await bus.publish(w.reply, TokenEvent(w.req_id, [], 1, finish=FinishReason.ERROR, source=self.engine,
                                                      error=f"KV hand-off to {w.de_engine} failed: {ack.error}",
                                                      retryable=True, code=ack.code or ErrorCode.KV_TRANSFER))
        finally:
            self.held.pop(w.req_id, None)

    async def _error(self, w: PrefillWork, code: ErrorCode, error: str) -> None:
        await self.host.bus.publish(w.reply, TokenEvent(w.req_id, [], finish=FinishReason.ERROR, source=self.engine,
                                                        error=error, code=code))


def _de_path(w: PrefillWork):
    """The plan's DE-path range (stored blocks the DE's TM lands), if any."""
    return next((r for r in w.plan.ranges if r.source == Source.STORE and r.engine == w.de_engine), None)
