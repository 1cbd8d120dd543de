"""Prefill-engine wiring: NATS intake, the prefill loop, and the hand-off to a decode engine.

Sequence for one request:
  `pe.<id>.work` PrefillWork -> queued (FIFO) -> batch forward in the model thread
  -> first token sampled and published on the request's output subject
  -> TM push (KV blocks -> the DE's buffer, data plane) -> `de.<id>.admit` -> blocks freed.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time

from opentelemetry import trace

from services.prefill_engine.batching import Candidate, take_batch
from services.prefill_engine.config import PrefillConfig
from shared.bus import BusError, Delivery
from shared.engine.kv_memory import KVMemory
from shared.engine.requests import EngineRequest, generator_seed, stop_ids
from shared.engine.worker import ModelWorker
from shared.messages.registry import EngineAnnounce
from shared.messages.stream import TokenEvent
from shared.messages.tm import PushDone, PushKV, Release
from shared.messages.work import Ack, Cancel, DecodeAdmit, PrefillWork
from shared.runtime import Service, service_main

log = logging.getLogger("prefill")
tracer = trace.get_tracer("prefill-engine")


class PrefillService(Service):
    name = "prefill-engine"

    def __init__(self, cfg: PrefillConfig):
        super().__init__(cfg)
        self.engine = cfg.engine or f"pe-{cfg.node}-{os.getpid()}"
        self.queue: list[tuple[EngineRequest, PrefillWork]] = []
        self.active: dict[str, EngineRequest] = {}
        self.wake = asyncio.Event()
        self._in_step: set[str] = set()  # requests inside the running forward
        self.loaded = None
        self.kv: KVMemory | None = None
        self.worker = ModelWorker(cfg.threads)
        m = self.metrics
        self.m_requests = m.counter("prefill_requests_total", "Prompts prefilled")
        self.m_tokens = m.counter("prefill_tokens_total", "Prompt tokens computed")
        self.m_step = m.histogram("prefill_step_seconds", "Prefill forward time")
        self.m_handoff = m.histogram("prefill_handoff_seconds", "KV push + admit time")
        self.m_free = m.gauge("kv_free_blocks", "Free KV blocks", ("engine",))
        self.m_queue = m.gauge("prefill_queue_length", "Requests waiting for prefill")

    async def start(self) -> None:
        from shared.model.loader import load_model

        self.loaded = await self.worker.run(load_model, self.cfg.model, seed=self.cfg.seed, dtype=self.cfg.dtype)
        self.kv = KVMemory(self.loaded.config, self.cfg.kv_blocks, self.cfg.block_size, tag="pe-kv")
        await self.bus.subscribe(self.subjects.prefill_work(self.engine), PrefillWork, self._on_work)
        await self.bus.subscribe(self.subjects.cancel, Cancel, self._on_cancel)
        self.spawn(self._loop(), name="prefill-loop")

    def announce(self) -> EngineAnnounce:
        kv = self.kv
        tok = sum(r.tokens for r in self.active.values())
        return EngineAnnounce(
            instance=self.instance, node=self.cfg.node, metrics_url=self.metrics_url, pid=os.getpid(),
            engine=self.engine, role="prefill", group=self.cfg.group or self.cfg.node,
            model_id=self.loaded.model_id if self.loaded else "", max_context=self._max_context(),
            seq=len(self.active), tok=tok, free_blocks=kv.alloc.free if kv else 0,
            total_blocks=kv.alloc.n_slots if kv else 0, kv=kv.layout() if kv else None)

    def _max_context(self) -> int:
        if not self.loaded:
            return 0
        return min(self.loaded.config.max_position, self.cfg.kv_blocks * self.cfg.block_size)

    async def stop(self) -> None:
        for req in list(self.active.values()):
            await self._fail(req, "prefill engine shutting down")
        self.worker.close()
        if self.kv:
            self.kv.close()

    # intake -------------------------------------------------------------
    async def _on_work(self, msg: PrefillWork, d: Delivery) -> None:
        req = EngineRequest(msg.req_id, msg.prompt, msg.sampling, msg.reply, d.ctx)
        if len(msg.prompt) > self._max_context():
            await self.bus.publish(msg.reply, TokenEvent(msg.req_id, [], finish="error", source=self.engine,
                                                         error="prompt longer than the engine's KV memory"))
            return
        self.active[req.req_id] = req
        self.queue.append((req, msg))
        self.m_queue.set(len(self.queue))
        self.wake.set()

    async def _on_cancel(self, msg: Cancel, d: Delivery) -> None:
        req = self.active.get(msg.req_id)
        if req is None:
            return
        req.cancelled = True
        self.queue = [(r, w) for r, w in self.queue if r.req_id != msg.req_id]
        if not req.blocks or req.req_id not in self._in_step:
            self._release(req)

    # prefill loop ---------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.queue:
                batch = self._pick()
                if not batch:
                    break  # out of KV memory: wait for hand-offs to free blocks
                await self._prefill(batch)

    def _pick(self) -> list[tuple[EngineRequest, PrefillWork]]:
        kv = self.kv
        cands = [Candidate(r.req_id, len(r.prompt), kv.blocks_for(len(r.prompt))) for r, _ in self.queue]
        chosen = {c.req_id for c in take_batch(cands, self.cfg.max_batch_tokens, kv.alloc.free)}
        batch = [(r, w) for r, w in self.queue if r.req_id in chosen]
        self.queue = [(r, w) for r, w in self.queue if r.req_id not in chosen]
        self.m_queue.set(len(self.queue))
        for r, _ in batch:
            r.blocks = kv.alloc.allocate(r.req_id, kv.blocks_for(len(r.prompt)))
        self.m_free.labels(self.engine).set(kv.alloc.free)
        return batch

    async def _prefill(self, batch: list[tuple[EngineRequest, PrefillWork]]) -> None:
        spans = [tracer.start_span("prefill", context=r.ctx, attributes={
            "req_id": r.req_id, "engine": self.engine, "prompt_tokens": len(r.prompt), "batch_size": len(batch)})
            for r, _ in batch]
        self._in_step = {r.req_id for r, _ in batch}
        t0 = time.perf_counter()
        try:
            firsts = await self.worker.run(self._forward, [r for r, _ in batch])
        except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, not the engine
            log.exception("prefill step failed")
            for (r, _), span in zip(batch, spans):
                span.record_exception(exc)
                span.end()
                await self._fail(r, f"prefill failed: {exc}")
            return
        finally:
            self._in_step = set()
        self.m_step.observe(time.perf_counter() - t0)
        for (r, w), span, tok in zip(batch, spans, firsts):
            span.end()
            self.m_requests.inc()
            self.m_tokens.inc(len(r.prompt))
            self.spawn(self._handoff(r, w, tok), name=f"handoff-{r.req_id}")

    def _forward(self, reqs: list[EngineRequest]) -> list[int]:
        """Model thread: one batched prefill, then the first token of each request."""
        import torch

        from shared.model.batch import ForwardBatch, SeqSlice
        from shared.model.sampling import sample

        batch = ForwardBatch([SeqSlice(r.prompt, 0, r.blocks) for r in reqs])
        with torch.inference_mode():
            logits = self.loaded.model.forward(batch, self.kv.cache)
        gens = []
        for r in reqs:
            seed = generator_seed(r.sampling, 0)
            gens.append(torch.Generator().manual_seed(seed) if seed is not None else None)
        return sample(logits, [r.sampling.temperature for r in reqs], [r.sampling.top_p for r in reqs], gens)

    # hand-off ---------------------------------------------------------------
    async def _handoff(self, req: EngineRequest, work: PrefillWork, first: int) -> None:
        sp = req.sampling
        done = first in stop_ids(sp, self.loaded.config.eos_ids)
        finish = "stop" if done else ("length" if sp.max_tokens <= 1 else "")
        await self._emit(TokenEvent(req.req_id, [first], 0, finish=finish, source=self.engine), req)
        if finish or req.cancelled:
            self._release(req)
            return
        t0 = time.perf_counter()
        with tracer.start_as_current_span("pd_handoff", context=req.ctx,
                                          attributes={"req_id": req.req_id, "de_engine": work.de_engine}):
            try:
                pushed = await self.bus.request(
                    self.subjects.tm(self.engine, "push"),
                    PushKV(req.req_id, req.blocks, work.de_engine, len(req.prompt)), PushDone,
                    timeout=self.cfg.handoff_timeout_s)
                if not pushed.ok:
                    raise BusError("push", pushed.error)
                if req.cancelled:
                    raise BusError("push", "cancelled")
                admit = DecodeAdmit(req.req_id, len(req.prompt), first, sp, req.reply, pushed.slots,
                                    pe_engine=self.engine, prompt=req.prompt)
                ack = await self.bus.request(self.subjects.decode_admit(work.de_engine), admit, Ack,
                                             timeout=self.cfg.handoff_timeout_s)
                if not ack.ok:
                    raise BusError("admit", ack.error)
            except BusError as exc:
                if not req.cancelled:
                    await self._fail(req, f"KV hand-off to {work.de_engine} failed: {exc.reason}")
                await self.bus.publish(self.subjects.tm(work.de_engine, "release"), Release(req.req_id))
            finally:
                self._release(req)
                self.m_handoff.observe(time.perf_counter() - t0)

    # helpers ----------------------------------------------------------------
    async def _emit(self, ev: TokenEvent, req: EngineRequest) -> None:
        await self.bus.publish(req.reply, ev, ctx=req.ctx)

    async def _fail(self, req: EngineRequest, error: str) -> None:
        await self.bus.publish(req.reply, TokenEvent(req.req_id, [], finish="error", error=error, source=self.engine))
        self._release(req)

    def _release(self, req: EngineRequest) -> None:
        self.active.pop(req.req_id, None)
        if self.kv:
            self.kv.alloc.release(req.req_id)
            self.m_free.labels(self.engine).set(self.kv.alloc.free)
        req.blocks = []
        self.wake.set()


def main(argv: list[str] | None = None) -> int:
    return service_main("prefill_engine", PrefillConfig, PrefillService, argv)
