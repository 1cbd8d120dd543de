"""Prefill-engine wiring: NATS intake, the prefill loop, cancellation and release.

Sequence for one request:
  `pe.<id>.work` PrefillWork -> [hits: KV blocks, storage read, layers (fetch.py)] -> queued
  (FIFO) -> batch forward in the model thread (batching.py) -> first token sampled and
  published on the request's output subject -> KV pushed to a decode engine and admitted
  there (handoff.py) -> blocks freed.
Each request is one `PrefillRequest` record (record.py) in `held`; `_release` drops it.
"""
from __future__ import annotations

import asyncio
import logging
import time

from opentelemetry import trace

from services.prefill_engine import memory
from services.prefill_engine.batching import Chunk, forward, pick
from services.prefill_engine.config import PrefillEngineConfig
from services.prefill_engine.fetch import Fetcher, usable_hits
from services.prefill_engine.handoff import Handoff
from services.prefill_engine.layers import LoadError
from services.prefill_engine.metrics import PrefillMetrics
from services.prefill_engine.record import PrefillRequest
from shared.bus import Delivery
from shared.engine.service import EngineService
from shared.messages.codes import ErrorCode, FinishReason, LoadMode
from shared.messages.endpoints import EP
from shared.messages.stream import TokenEvent
from shared.messages.traffic_manager import FetchProgress, LayersComputed, Release
from shared.messages.work import Cancel, PrefillWork
from shared.runtime import service_main
from shared.sched.policy.intra_pe import AttentionModel

log = logging.getLogger("prefill_engine")
tracer = trace.get_tracer("prefill_engine")


class PrefillEngineService(EngineService):
    name = "prefill_engine"
    role = "prefill"
    kv_tag = "pe-kv"

    def __init__(self, cfg: PrefillEngineConfig):
        super().__init__(cfg)
        self.held: dict[str, PrefillRequest] = {}
        self.queue: list[PrefillRequest] = []  # ready to compute (hits loaded, or none)
        self.attn_model = AttentionModel(per_pair=cfg.attn_per_pair_s, per_token=cfg.attn_per_token_s,
                                         per_batch=cfg.attn_per_batch_s)
        self.fetcher: Fetcher | None = None
        self.handoff: Handoff | None = None
        self.pm = PrefillMetrics(self.metrics, self.engine)
        self.s_per_token = 1e-3  # measured prefill seconds per computed token (moving average)

    async def start(self) -> None:
        await self.load()
        cfg = self.cfg
        self.fetcher = Fetcher(self.bus, self.subjects.at(EP.TM_FETCH, engine=self.engine), cfg, self.store, self.kv,
                               self.loaded.config.n_layers, self.held, self.spawn, ready=self._ready,
                               fail=self.fail, failed_load=self._load_failed, release=self._release,
                               one_forward=self._one_forward, estimate=self._estimate, abandon=self._abandon,
                               engine=self.engine, subjects=self.subjects,
                               metrics=self.metrics)
        self.handoff = Handoff(self.bus, self.subjects, self.engine, cfg.handoff_timeout_s,
                               self.loaded.config.eos_ids, self.pm.handoff.observe, fail=self.fail,
                               release=self._release, drop_de_slots=self._drop_de_slots, store=self.store,
                               node=cfg.node, spawn=self.spawn, observe_tail=self.pm.tail.observe)
        await self.bus.subscribe(self.subjects.at(EP.PE_WORK, engine=self.engine), self._on_work)
        await self.bus.subscribe(self.subjects.at(EP.PE_LOADED, engine=self.engine), self._on_loaded)
        await self.bus.subscribe(self.subjects.at(EP.CANCEL), self._on_cancel)
        await self.watch_tm()
        self.spawn(self._loop(), name="prefill-loop")

    async def stop(self) -> None:
        for req in self.held.values():  # a forward waiting on stored KV returns now, not at its layer timeout
            if req.load is not None:
                req.load.fail("prefill engine shutting down", ErrorCode.SHUTTING_DOWN)
        await super().stop()

    # intake -------------------------------------------------------------
    async def _on_work(self, msg: PrefillWork, d: Delivery) -> None:
        if len(msg.prompt) > self.max_context():
            await self.bus.publish(msg.reply, TokenEvent(msg.req_id, [], finish=FinishReason.ERROR, source=self.engine,
                                                         error="prompt longer than the engine's KV memory",
                                                         code=ErrorCode.PROMPT_TOO_LONG))
            return
        req = PrefillRequest(msg.req_id, msg.prompt, msg.sampling, msg.reply, d.ctx, work=msg)
        self.held[req.req_id] = req
        hits = usable_hits(msg, self.cfg.block_size)
        if msg.mode == LoadMode.ORACLE:  # no I/O: the hit KV is taken as present (output not meaningful)
            req.hit_tokens = hits * self.cfg.block_size
        (self.fetcher.waiting if hits and msg.mode != LoadMode.ORACLE else self.queue).append(req)
        self._note_queue()
        self.wake.set()

    async def _on_loaded(self, msg: FetchProgress, d: Delivery) -> None:
        await self.fetcher.on_progress(msg)

    def _ready(self, req: PrefillRequest) -> None:
        """Its stored KV is read (or it turned out a miss): it may be computed."""
        self.queue.append(req)
        self.wake.set()

    async def _load_failed(self, req: PrefillRequest, code: ErrorCode, error: str) -> None:
        """Its stored KV will not arrive: a forward computing it fails it (LoadError); else fail it now."""
        if req.in_step:
            return
        self.queue = [r for r in self.queue if r is not req]
        if req.cancelled:
            self._release(req)
        else:
            await self.fail(req, code, error, retryable=True)

    async def _on_cancel(self, msg: Cancel, d: Delivery) -> None:
        req = self.held.get(msg.req_id)
        if req is None:
            return
        req.cancelled = True
        self.queue = [r for r in self.queue if r is not req]
        self.fetcher.drop(req)
        if req.reading or req.in_step or req.handing_off:
            return  # the TM is still reading into its blocks / the forward computes it / the hand-off ends it
        self._drop(req)

    # prefill loop ---------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            self.fetcher.start()
            for r in [r for r in self.queue if r.cancelled]:
                self._drop(r)
            self.queue = [r for r in self.queue if not r.cancelled]
            self._note_queue()
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
        pushes = [c.req for c in batch if c.cached + c.bsz >= len(c.req.prompt) and c.req.work.mode.moves_kv]
        for c in batch:
            c.req.in_step = True
        for r in pushes:  # each layer goes to the DE as soon as it is computed (in about `expect_s`)
            self.handoff.start_push(r, expect_s=sum(c.bsz for c in batch) * self.s_per_token)
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
            for c in batch:
                c.req.in_step = False
            alive.cancel()
        dt = time.perf_counter() - t0
        self.pm.step.observe(dt)
        self.pm.compute.inc(max(0.0, dt - waited))
        self.s_per_token = 0.8 * self.s_per_token + 0.2 * max(0.0, dt - waited) / max(1, sum(c.bsz for c in batch))
        step_span.end()
        for c, span, tok in zip(batch, spans, firsts):
            self._after_step(c, span, tok)
        self._note_queue()

    async def _step_failed(self, batch: list[Chunk], spans: list, exc: Exception) -> None:
        """A load that failed fails its own request, and those whose KV was already on its way to the
        DE or whose hits live in a window (retryable: resumed elsewhere); the others compute again in
        the next forward. Any other error fails the whole batch. Pushes end before blocks are freed."""
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
                self.queue = [r for r in self.queue if r is not c.req]
                code = exc.code if load else ErrorCode.ENGINE_FAILED
                await self.fail(c.req, code, f"prefill failed: {exc}", retryable=load)
        self.wake.set()

    def _after_step(self, c: Chunk, span, tok) -> None:
        r = c.req
        if r.cancelled and tok is None:
            span.end()
            self.queue = [q for q in self.queue if q is not r]
            self._drop(r)
            return
        r.computed = c.cached + c.bsz
        self.pm.tokens.inc(c.bsz)
        span.set_attributes({"hit_tokens": r.hit_tokens, "layer_wait_s": r.load.waited_s if r.load else 0.0})
        span.end()
        if tok is None:
            return  # chunked prefill: the rest of the prompt in a later forward
        self.queue = [q for q in self.queue if q is not r]
        r.tiers = r.prompt_tiers(self.cfg.block_size)  # where its prompt's KV came from: its first token says
        self.pm.prefilled(r.tiers)
        r.handing_off = True  # from now on a cancel is the hand-off's to handle
        self.spawn(self.handoff.run(r, *tok), name=f"handoff-{r.req_id}",
                   on_error=lambda exc: self.fail(r, ErrorCode.INTERNAL, f"KV hand-off failed: {exc}", retryable=True))

    # helpers ----------------------------------------------------------------
    def _computed(self, reqs: list[PrefillRequest], layer: int) -> None:
        """Event loop: layer `layer` of this forward is computed; the TM pushes it for `reqs`."""
        if layer == self.loaded.config.n_layers - 1:
            now = time.perf_counter()
            for r in reqs:
                r.computed_at = now
        self.spawn(self.bus.publish(self.subjects.at(EP.TM_COMPUTED, engine=self.engine),
                                    LayersComputed([r.req_id for r in reqs], layer)), name="computed")

    async def tm_restarted(self) -> None:
        """No read, layer copy or push of the old TM lands now: what waited on one fails (retryable)
        or, cancelled, is released at once, not at its deadline."""
        for req in list(self.held.values()):
            if req.copies_done(self.loaded.config.n_layers) and (req.push is None or req.push.done()):
                continue
            req.copies_gone, req.reading = True, False
            if req.load is not None:
                req.load.fail("its traffic manager restarted", ErrorCode.KV_TRANSFER)
            if req.push is not None:
                req.push.cancel()  # the hand-off sees it fail and releases the blocks
            elif not req.handing_off:
                self.fetcher.drop(req)
                await self._load_failed(req, ErrorCode.KV_TRANSFER, "its traffic manager restarted")

    def _one_forward(self, cached: int, prompt_len: int) -> bool:
        """A prompt's missing part fits one forward (so its hits may live in a window)."""
        miss, cfg = prompt_len - cached, self.cfg
        return miss <= cfg.max_batch_tokens and self.attn_model.batch_time([(cached, miss)]) <= cfg.compute_quota_s

    def _estimate(self, req: PrefillRequest) -> float:
        """Seconds a forward computing `req` alone takes, at the measured rate."""
        return (len(req.prompt) - req.hit_tokens) * self.s_per_token

    def _allocate(self, req: PrefillRequest) -> bool:
        """KV blocks for a request that loads nothing (a miss, or the oracle's hits taken as present)."""
        cfg, hits = self.cfg, req.hit_tokens // self.cfg.block_size
        window = cfg.hit_window_layers if hits and self._one_forward(req.hit_tokens, len(req.prompt)) else 0
        return memory.allocate(self.kv, req, hits, window, self.loaded.config.n_layers)

    async def _abandon(self, req: PrefillRequest, code: ErrorCode, error: str) -> None:
        """Fail it (retryable) now; free its blocks once its TM no longer copies into them."""
        self.queue = [r for r in self.queue if r is not req]
        await self.fail(req, code, error, retryable=True, release=False)
        req.cancelled = True
        await self.bus.publish(self.subjects.at(EP.TM_RELEASE, engine=self.engine), Release(req.req_id))
        self._drop(req)

    def _note_queue(self) -> None:
        self.pm.queue.set(len(self.queue) + len(self.fetcher.waiting if self.fetcher else ()))

    def _drop_de_slots(self, req: PrefillRequest) -> None:
        """The DE buffer slots staged for a request that will not reach that DE: free them."""
        engine, req.de_held = req.de_held, ""
        if engine:
            self.spawn(self.bus.publish(self.subjects.at(EP.TM_RELEASE, engine=engine), Release(req.req_id)),
                       name=f"release-de-{req.req_id}")

    async def fail(self, req: PrefillRequest, code: ErrorCode, error: str, retryable: bool = False,
                   release: bool = True) -> None:
        self._drop_de_slots(req)
        try:
            await self.publish_error(req, code, error, retryable)
        finally:
            if release:
                self._release(req)

    def _drop(self, req: PrefillRequest) -> None:
        """Cancelled: release now, or when its last layer copy lands (or one deadline later, if it never does)."""
        if req.copies_done(self.loaded.config.n_layers):
            self._release(req)
            return
        req.cancel_timer()
        req.timer = self.spawn(self._release_after_deadline(req), name=f"release-{req.req_id}")

    async def _release_after_deadline(self, req: PrefillRequest) -> None:
        await asyncio.sleep(self.cfg.handoff_timeout_s)
        self._release(req)

    def _release(self, req: PrefillRequest) -> None:
        holder = self.held.get(req.req_id)
        if holder is not None and holder is not req:
            return  # released before; its id (and its blocks' owner name) belongs to a newer record
        self.held.pop(req.req_id, None)
        req.cancel_timer()
        req.de_held = ""
        self.free_blocks(req)


def main(argv: list[str] | None = None) -> int:
    return service_main("prefill_engine", PrefillEngineConfig, PrefillEngineService, argv)
