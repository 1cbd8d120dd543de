"""Prefill-engine wiring: NATS intake, the prefill loop, cancellation and release.

A request's state moves here alone (`PeLife.move`), as the fetch and the hand-off say (outcomes.py)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable

import msgspec
from opentelemetry import trace

from services.prefill_engine import memory
from services.prefill_engine.batching import Chunk, attention_model, forward, layerwise_pushes, one_forward, pick
from services.prefill_engine.config import PrefillEngineConfig
from services.prefill_engine.fetch import Fetcher
from services.prefill_engine.handoff import Handoff
from services.prefill_engine.layers import LoadError
from services.prefill_engine.life import ENDING, HELD, PeLife, PeState
from services.prefill_engine.link import PeLink
from services.prefill_engine.metrics import PrefillMetrics
from services.prefill_engine.outcomes import Abandon, Fail, Free, LoadFailed, Outcome, Ready, Send
from services.prefill_engine.plan_read import plan_loads
from services.prefill_engine.record import PrefillRequest
from shared.bus import Delivery
from shared.engine.service import EngineService
from shared.states import IllegalTransition
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.plan import PlanError
from shared.messages.endpoints import EP
from shared.messages.registry import EngineAnnounce
from shared.messages.stream import TokenEvent, TokenLogprob
from shared.messages.traffic_manager import FetchKV, FetchProgress, LayersComputed, Release
from shared.messages.work import Cancel, PrefillWork
from shared.runtime import service_main, task_label

log = logging.getLogger("prefill_engine")
tracer = trace.get_tracer("prefill_engine")
P = PeState


class PrefillEngineService(EngineService):
    name = "prefill_engine"
    role = "prefill"
    kv_tag = "pe-kv"

    def __init__(self, cfg: PrefillEngineConfig):
        super().__init__(cfg)
        self.held: dict[str, PrefillRequest] = {}
        self.queue: list[PrefillRequest] = []  # READY to compute, FIFO (and COMPUTING while their forward runs)
        self.attn_model = attention_model(cfg)
        self.fetcher: Fetcher | None = None
        self.handoff: Handoff | None = None
        self.pm = PrefillMetrics(self.metrics, self.engine)
        self.life = PeLife(self.engine, self.pm)  # each request's state: the one writer of PrefillRequest.state
        self.s_per_token = 1e-3  # measured prefill seconds per computed token (moving average)

    async def start(self) -> None:
        await self.load()
        self.parts()
        await self.bus.subscribe(self.subjects.at(EP.PE_WORK, engine=self.engine), self._on_work)
        await self.bus.subscribe(self.subjects.at(EP.PE_LOADED, engine=self.engine), self._on_loaded)
        await self.bus.subscribe(self.subjects.at(EP.CANCEL), self._on_cancel)
        await self.watch_tm()
        self.bus.losses.on_reconnect.append(self._reconnected)
        self.spawn(self._loop(), name="prefill-loop")

    def parts(self) -> None:
        link = PeLink(self.bus, self.subjects, self.engine, self.spawn)
        self.fetcher = Fetcher(link, self.cfg, self.store, self.kv, self.metrics)
        self.handoff = Handoff(link, self.cfg, self.store, self.loaded.config.eos_ids, self.pm)

    def announce(self) -> EngineAnnounce:
        return msgspec.structs.replace(super().announce(), seq=self.life.held())

    async def stop(self) -> None:
        for req in self.held.values():  # a forward waiting on stored KV returns now, not at its layer timeout
            if req.load is not None:
                req.load.fail("prefill engine shutting down", ErrorCode.SHUTTING_DOWN)
        await super().stop()

    # intake -------------------------------------------------------------
    async def _on_work(self, msg: PrefillWork, d: Delivery) -> None:
        if len(msg.prompt) > self.max_context():
            await self._refuse(msg, ErrorCode.PROMPT_TOO_LONG, "prompt longer than the engine's KV memory")
            return
        try:
            loads = plan_loads(msg, self.engine, self.cfg.block_size)
        except PlanError as exc:
            await self._refuse(msg, exc.code, f"KV plan not executable: {exc}")
            return
        req = PrefillRequest(msg.req_id, msg.prompt, msg.sampling, msg.reply, d.ctx, work=msg, loads=loads)
        req.connection = self.bus.losses.current()
        self.held[req.req_id] = req
        hits = loads.hits
        if loads.present:  # no I/O: the hit KV is taken as present (output not meaningful)
            req.hit_tokens = hits * self.cfg.block_size
        if hits and not loads.present:
            self.life.enter(req, P.WAITING_BLOCKS, f"{hits} stored blocks to load")
            self.fetcher.waiting.append(req)
        else:
            self.life.enter(req, P.READY, "nothing to load")
            self.queue.append(req)
        self.wake.set()

    async def _refuse(self, msg: PrefillWork, code: ErrorCode, error: str) -> None:
        await self.bus.publish(msg.reply, TokenEvent(msg.req_id, [], finish=FinishReason.ERROR, source=self.engine,
                                                     error=error, code=code))

    async def _on_loaded(self, msg: FetchProgress, d: Delivery) -> None:
        req = self.held.get(msg.req_id)
        if req is not None:
            await self.do(self.fetcher.on_progress(req, msg))

    async def _on_cancel(self, msg: Cancel, d: Delivery) -> None:
        req = self.held.get(msg.req_id)
        if req is not None:
            self._cancel(req)

    def _cancel(self, req: PrefillRequest) -> None:
        """The client left: end it now, or once no forward, hand-off, read or layer copy still holds it."""
        state = req.state
        if state in ENDING:
            return
        self._unqueue(req)
        if state in HELD:
            self.move(req, P.CANCELLING, "cancelled: its forward or hand-off ends it")
            req.leave()  # a hand-off waiting on a decode side that may be dead stops waiting
            return
        self.move(req, P.CANCELLED, "cancelled")
        if state is not P.READING:
            self._drop(req)

    # what the fetch and the hand-off say ------------------------------------
    async def do(self, outcomes: Iterable[Outcome]) -> None:
        for o in outcomes:
            match o:
                case Ready(req, eta_s):
                    self._ready(req, eta_s)
                case Send(req, fetch):
                    self._send(req, fetch)
                case Fail(req, code, error, retryable, release):
                    await self.fail(req, code, error, retryable, release)
                case LoadFailed(req, code, error):
                    await self._load_failed(req, code, error)
                case Abandon(req, code, error):
                    await self._abandon(req, code, error)
                case Free(req):
                    self._release(req)

    async def _drive(self, step: AsyncIterator[Outcome]) -> None:
        """Carry out each outcome of a running fetch or hand-off step as it comes; the step is closed here."""
        async with contextlib.aclosing(step) as outcomes:
            async for o in outcomes:
                await self.do((o,))

    def _run(self, step: AsyncIterator[Outcome], name: str, **kw) -> asyncio.Task:
        return self.spawn(self._drive(step), name=name, label=task_label(step), **kw)

    def _send(self, req: PrefillRequest, fetch: FetchKV) -> None:
        self.move(req, P.READING, "KV blocks allocated: storage read sent")
        req.timer = self._run(self.fetcher.deadline(req), f"fetch-deadline-{req.req_id}")
        self._run(self.fetcher.send(req, fetch), f"fetch-{req.req_id}")

    def _ready(self, req: PrefillRequest, eta_s: float) -> None:
        """Queue it when its read is about to end, so its own compute overlaps the read's tail."""
        if req.state not in (P.WAITING_BLOCKS, P.READING):
            if req.state is P.CANCELLED:
                self._drop(req)  # its client left while it was read: freed once its copies land
            return
        delay = eta_s - self._estimate(req)
        if delay <= 0:
            self._queue(req, "stored KV read")
            return
        self.move(req, P.LOADING, f"stored KV read: its layers land within {eta_s:.3f}s")
        self.spawn(self._ready_later(req, delay), name=f"ready-{req.req_id}")

    async def _ready_later(self, req: PrefillRequest, delay: float) -> None:
        await asyncio.sleep(delay)
        if req.state is P.LOADING:
            self._queue(req, "its read is about to end")

    def _queue(self, req: PrefillRequest, why: str) -> None:
        if self.move(req, P.READY, why):
            self.queue.append(req)
            self.wake.set()

    async def _load_failed(self, req: PrefillRequest, code: ErrorCode, error: str) -> None:
        """Its stored KV will not arrive: a forward computing it fails it (LoadError), else it fails now."""
        if req.state in HELD or req.state is P.RELEASED:
            return
        if req.state in ENDING:
            self._release(req)
        else:
            await self.fail(req, code, error, retryable=True)

    async def _abandon(self, req: PrefillRequest, code: ErrorCode, error: str) -> None:
        """Fail it (retryable) now; free its blocks once its TM no longer copies into them."""
        await self.fail(req, code, error, retryable=True, release=False)
        await self.bus.publish(self.subjects.at(EP.TM_RELEASE, engine=self.engine), Release(req.req_id))
        self._drop(req)

    # prefill loop ---------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            await self.do(self.fetcher.start())
            while self.queue:
                cfg = self.cfg
                batch = pick(self.queue, self._allocate, self.attn_model, cfg.compute_quota_s, cfg.max_batch_tokens)
                self.note_free()
                if not batch:
                    break  # out of KV memory: wait for hand-offs to free blocks
                await self._prefill(batch)

    async def _prefill(self, batch: list[Chunk]) -> None:
        spans = [tracer.start_span("prefill_chunk", context=c.req.ctx, attributes={
            "req_id": c.req.req_id, "engine": self.engine, "prompt_tokens": len(c.req.prompt), "cached": c.cached,
            "bsz": c.bsz, "batch_size": len(batch)}) for c in batch]
        # one forward serves the whole batch: its own span, linked to every request it computes
        step_span = tracer.start_span("prefill_batch", links=[trace.Link(sp.get_span_context()) for sp in spans],
                                      attributes={"engine": self.engine, "batch_size": len(batch),
                                                  "tokens": sum(c.bsz for c in batch)})
        expect_s = sum(c.bsz for c in batch) * self.s_per_token
        pushes = layerwise_pushes(batch, expect_s, self.cfg.layerwise_push_min_s)
        for c in batch:
            self.move(c.req, P.COMPUTING, f"in a forward of {len(batch)}")
        for r in pushes:  # each layer goes to the DE as soon as it is computed (in about `expect_s`)
            self.handoff.start_push(r, expect_s=expect_s)
        loop = asyncio.get_running_loop()
        computed = (lambda layer: loop.call_soon_threadsafe(self._computed, pushes, layer)) if pushes else None
        alive = self.spawn(self.handoff.keepalive(pushes), name="keepalive")  # until the forward ends
        t0 = time.perf_counter()
        try:
            firsts, waited = await self.worker.run(forward, self.loaded.model, self.kv, batch,
                                                   self.cfg.handoff_timeout_s, computed)
        except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, not the engine
            step_span.end()
            await self._step_failed(batch, spans, exc)
            return
        finally:
            alive.cancel()
        dt = time.perf_counter() - t0
        self.pm.step.observe(dt)
        self.pm.compute.inc(max(0.0, dt - waited))
        self.s_per_token = 0.8 * self.s_per_token + 0.2 * max(0.0, dt - waited) / max(1, sum(c.bsz for c in batch))
        step_span.end()
        for c, span, tok in zip(batch, spans, firsts):
            self._after_step(c, span, tok)

    async def _step_failed(self, batch: list[Chunk], spans: list, exc: Exception) -> None:
        """A failed load fails its own request and those that cannot compute again (retryable); the others
        go back to the queue. Any other error fails the batch. Pushes end before blocks are freed."""
        load = isinstance(exc, LoadError)
        if not load:
            log.exception("prefill step failed", exc_info=exc)
        for c in batch:
            await self.handoff.abort_push(c.req)
        for c, span in zip(batch, spans):
            hit = not load or c.req.req_id == exc.req_id or c.req.push is not None or c.req.window is not None
            if hit:
                span.record_exception(exc)
            span.end()
            if hit:
                code = exc.code if load else ErrorCode.ENGINE_FAILED
                await self.fail(c.req, code, f"prefill failed: {exc}", retryable=load)
            else:
                self._forward_over(c.req, f"computed again: its forward failed ({exc})")
        self.wake.set()

    def _after_step(self, c: Chunk, span, tok: tuple[int, TokenLogprob | None] | None) -> None:
        r = c.req
        if r.state not in (P.COMPUTING, P.CANCELLING) or (r.state is P.CANCELLING and tok is None):
            span.end()
            self._forward_over(r, "")  # cancelled (or failed) while it computed
            return
        r.computed = c.cached + c.bsz
        self.pm.tokens.inc(c.bsz)
        span.set_attributes({"hit_tokens": r.hit_tokens, "layer_wait_s": r.load.waited_s if r.load else 0.0})
        span.end()
        if tok is None:
            self._forward_over(r, "chunked prefill: the rest of the prompt in a later forward")
            return
        self._unqueue(r)
        r.tiers = r.prompt_tiers(self.cfg.block_size)  # where its prompt's KV came from: its first token says
        self.pm.prefilled(r.tiers)
        if r.state is P.COMPUTING:  # from now on a cancel is the hand-off's to handle
            self.move(r, P.HANDING_OFF, "first token sampled")
        self._run(self.handoff.run(r, *tok), f"handoff-{r.req_id}",
                  on_error=lambda exc: self.fail(r, ErrorCode.INTERNAL, f"KV hand-off failed: {exc}", retryable=True))

    def _forward_over(self, req: PrefillRequest, why: str) -> None:
        if req.state is P.COMPUTING:
            self.move(req, P.READY, why)
        elif req.state is P.CANCELLING:
            self._unqueue(req)
            self.move(req, P.CANCELLED, "cancelled: its forward is over")
            self._drop(req)

    # helpers ----------------------------------------------------------------
    def move(self, req: PrefillRequest, to: PeState, why: str = "") -> bool:
        try:
            self.life.move(req, to, why)
        except IllegalTransition as exc:
            log.error("%s (%s)", exc, why)
            return False
        return True

    def _computed(self, reqs: list[PrefillRequest], layer: int) -> None:
        """Event loop: layer `layer` of this forward is computed; the TM pushes it for `reqs`."""
        if layer == self.loaded.config.n_layers - 1:
            now = time.perf_counter()
            for r in reqs:
                r.computed_at = now
        self.spawn(self.bus.publish(self.subjects.at(EP.TM_COMPUTED, engine=self.engine),
                                    LayersComputed([r.req_id for r in reqs], layer)), name="computed")

    async def tm_restarted(self) -> None:
        """The old TM's transfers never land: what waits on one fails (retryable) or is freed now."""
        for req in list(self.held.values()):
            if self._in_transfer(req):
                await self._transfers_gone(req, ErrorCode.KV_TRANSFER, "its traffic manager restarted")

    def _in_transfer(self, req: PrefillRequest) -> bool:
        return not req.copies_done(self.loaded.config.n_layers) or (req.push is not None and not req.push.done())

    async def _transfers_gone(self, req: PrefillRequest, code: ErrorCode, why: str) -> None:
        if req.load is not None:
            req.load.gone, req.load.reading = True, False
            req.load.fail(why, code)
        if req.push is not None:
            req.push.cancel()  # the hand-off sees it fail and releases the blocks
        else:
            await self._load_failed(req, code, why)

    def _reconnected(self) -> None:
        """Back on NATS: a Cancel or a load's news sent meanwhile may be lost, and the scheduler resumes what it
        placed; so each held attempt ends here with a retryable error (ignored by a scheduler that resumed it)."""
        why = "its prefill engine lost NATS"
        for req in list(self.held.values()):
            if req.state in ENDING or not req.connection.done():  # arrived since: its messages are whole
                continue
            if self._in_transfer(req):
                self.spawn(self._transfers_gone(req, ErrorCode.ENGINE_FAILED, why), name=f"abandon-{req.req_id}")
            else:
                self.spawn(self.publish_error(req, ErrorCode.ENGINE_FAILED, why, True), name=f"abandon-{req.req_id}")
                self._cancel(req)

    def _estimate(self, req: PrefillRequest) -> float:
        """Seconds a forward computing `req` alone takes, at the measured rate."""
        return (len(req.prompt) - req.hit_tokens) * self.s_per_token

    def _allocate(self, req: PrefillRequest) -> bool:
        """KV blocks for a request that loads nothing (a miss, or hits its plan takes as present)."""
        cfg, hits = self.cfg, req.hit_tokens // self.cfg.block_size
        window = cfg.hit_window_layers if hits and one_forward(cfg, self.attn_model, req.hit_tokens,
                                                               len(req.prompt)) else 0
        return memory.allocate(self.kv, req, hits, window, self.loaded.config.n_layers)

    def _unqueue(self, req: PrefillRequest) -> None:
        self.queue = [r for r in self.queue if r is not req]
        if self.fetcher is not None:
            self.fetcher.drop(req)

    async def fail(self, req: PrefillRequest, code: ErrorCode, error: str, retryable: bool = False,
                   release: bool = True) -> None:
        """Answer it with an error; release it now, or (`release` False) its holder releases it later."""
        if req.state not in ENDING:
            self.move(req, P.FAILED, f"{code}: {error}")
        self._unqueue(req)
        self.handoff.drop_de_slots(req)
        try:
            await self.publish_error(req, code, error, retryable)
        finally:
            if release:
                self._release(req)

    def _drop(self, req: PrefillRequest) -> None:
        """Cancelled: release now, or once its last layer copy lands (at most one deadline later)."""
        if req.copies_done(self.loaded.config.n_layers):
            self._release(req)
            return
        req.cancel_timer()
        req.timer = self.spawn(self._release_after_deadline(req), name=f"release-{req.req_id}")

    async def _release_after_deadline(self, req: PrefillRequest) -> None:
        await asyncio.sleep(self.cfg.handoff_timeout_s)
        self._release(req)

    def _release(self, req: PrefillRequest) -> None:
        if req.state is P.RELEASED or not self.move(req, P.RELEASED, "its KV blocks freed"):
            return  # released before (its id, and its blocks' owner name, may belong to a newer record)
        self._unqueue(req)
        req.cancel_timer()
        req.de_held = ""
        holder = self.held.get(req.req_id)
        if holder is not None and holder is not req:
            return  # a newer record holds its id, and its blocks' owner name
        self.held.pop(req.req_id, None)
        self.free_blocks(req)

def main(argv: list[str] | None = None) -> int:
    return service_main("prefill_engine", PrefillEngineConfig, PrefillEngineService, argv)
