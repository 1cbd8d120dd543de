"""Decode-engine wiring: admission of handed-off prompts and the continuous-batching loop.

Sequence for one request:
  `de.<id>.admit` DecodeAdmit (KV already in this engine's TM buffer) -> Ack
  -> waits for free KV blocks (FIFO) -> TM `load` copies buffer -> KV memory, frees buffer
  -> joins the running batch; every step: one token per sequence, published as one StepEvents
     per output subject (every request of that scheduler in the batch); a sequence leaves on
     stop / length / cancel and frees its blocks.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time

from opentelemetry import trace

from services.decode_engine.config import DecodeConfig
from services.decode_engine.persist import Persister
from services.decode_engine.running import RunningSeq, admit_order, filled_block, finish_reason
from shared.bus import BusError, Delivery
from shared.engine.kv_memory import KVMemory
from shared.engine.requests import EngineRequest, RecentSet, generator_seed, stop_ids
from shared.engine.store_layout import store_layout
from shared.engine.worker import ModelWorker
from shared.messages.registry import EngineAnnounce
from shared.messages.stream import StepEvents, TokenEvent, TokenLogprob
from shared.messages.tm import LoadKV, PushDone, Release
from shared.messages.work import Ack, Cancel, DecodeAdmit
from shared.runtime import Service, service_main

log = logging.getLogger("decode")
STEP_SAMPLE = 16  # a decode_step event on the request's decode span every this many tokens
tracer = trace.get_tracer("decode-engine")


class DecodeService(Service):
    name = "decode-engine"

    def __init__(self, cfg: DecodeConfig):
        super().__init__(cfg)
        self.engine = cfg.engine or f"de-{cfg.node}-{os.getpid()}"
        self.waiting: list[EngineRequest] = []  # admitted, KV in the buffer, no blocks yet
        self.admits: dict[str, DecodeAdmit] = {}
        self.ready: list[RunningSeq] = []  # KV in KV memory, joining at the next step
        self.running: list[RunningSeq] = []
        self.held: dict[str, EngineRequest] = {}  # every request this engine holds
        self.cancelled = RecentSet()  # cancels that may arrive before their admission
        self.wake = asyncio.Event()
        self.loaded = None
        self.kv: KVMemory | None = None
        self.persister: Persister | None = None
        self.worker = ModelWorker(cfg.threads, cfg.heap_keep_mb)
        m = self.metrics
        self.m_tokens = m.counter("decode_tokens_total", "Tokens generated")
        self.m_step = m.histogram("decode_step_seconds", "Decode step time (one token per running sequence)")
        self.m_batch = m.gauge("decode_running", "Sequences in the running batch")
        self.m_free = m.gauge("kv_free_blocks", "Free KV blocks", ("engine",))
        self.m_load = m.histogram("decode_kv_load_seconds", "Buffer -> KV memory copy time")

    async def start(self) -> None:
        from shared.model.loader import load_model

        self.loaded = await self.worker.run(load_model, self.cfg.model, seed=self.cfg.seed, dtype=self.cfg.dtype)
        self.kv = KVMemory(self.loaded.config, self.cfg.kv_blocks, self.cfg.block_size, tag="de-kv")
        self.persister = Persister(self, store_layout(self.loaded.model_id, self.loaded.config, self.cfg.block_size))
        await self.bus.subscribe(self.subjects.decode_admit(self.engine), DecodeAdmit, self._on_admit)
        await self.bus.subscribe(self.subjects.cancel, Cancel, self._on_cancel)
        self.spawn(self._loop(), name="decode-loop")

    def announce(self) -> EngineAnnounce:
        kv = self.kv
        return EngineAnnounce(
            instance=self.instance, node=self.cfg.node, metrics_url=self.metrics_url, pid=os.getpid(),
            engine=self.engine, role="decode", group=self.cfg.group or self.cfg.node,
            model_id=self.loaded.model_id if self.loaded else "", max_context=self._max_context(),
            seq=len(self.held), tok=sum(r.tokens for r in self.held.values()),
            free_blocks=kv.alloc.free if kv else 0, total_blocks=kv.alloc.n_slots if kv else 0,
            kv=kv.layout() if kv else None, store=self.persister.layout if self.kv else None)

    def _max_context(self) -> int:
        if not self.loaded:
            return 0
        return min(self.loaded.config.max_position, self.cfg.kv_blocks * self.cfg.block_size)

    async def stop(self) -> None:
        for req in list(self.held.values()):
            await self._finish(req, "error", "decode engine shutting down", retryable=True)
        self.worker.close()
        if self.kv:
            self.kv.close()

    # admission ----------------------------------------------------------------
    async def _on_admit(self, msg: DecodeAdmit, d: Delivery) -> None:
        if msg.req_id in self.cancelled:
            await d.respond(Ack(False, "request was cancelled"))
            return
        if msg.prompt_len + 1 > self._max_context():
            await d.respond(Ack(False, f"prompt of {msg.prompt_len} tokens exceeds context {self._max_context()}"))
            return
        req = EngineRequest(msg.req_id, list(msg.prompt), msg.sampling, msg.reply, d.ctx)
        req.generated.append(msg.first_token)
        self.held[req.req_id] = req
        self.admits[req.req_id] = msg
        self.waiting.append(req)
        await d.respond(Ack())
        self.wake.set()

    def _blocks_needed(self, req: EngineRequest) -> int:
        admit = self.admits[req.req_id]
        limit = min(admit.prompt_len + req.sampling.max_tokens, self._max_context())
        return self.kv.blocks_for(limit)

    def _start_loads(self) -> None:
        room = self.cfg.max_running - len(self.running) - len(self.ready)
        for req in admit_order(self.waiting, self.kv.alloc.free, self._blocks_needed, room):
            self.waiting.remove(req)
            req.blocks = self.kv.alloc.allocate(req.req_id, self._blocks_needed(req))
            self.spawn(self._load(req), name=f"load-{req.req_id}")
        self.m_free.labels(self.engine).set(self.kv.alloc.free)

    async def _load(self, req: EngineRequest) -> None:
        admit = self.admits.pop(req.req_id)
        n = len(admit.buf_slots)
        t0 = time.perf_counter()
        with tracer.start_as_current_span("kv_load", context=req.ctx,
                                          attributes={"req_id": req.req_id, "blocks": n, "engine": self.engine}):
            try:
                if admit.oracle:
                    raise _Skip  # oracle mode: no KV was moved, nothing to copy
                done = await self.bus.request(self.subjects.tm(self.engine, "load"),
                                              LoadKV(req.req_id, admit.buf_slots, req.blocks[:n]), PushDone,
                                              timeout=self.cfg.load_timeout_s)
                if not done.ok:
                    raise BusError("load", done.error)
            except _Skip:
                pass
            except BusError as exc:
                await self._finish(req, "error", f"KV load failed: {exc.reason}", retryable=True)
                return
        self.m_load.observe(time.perf_counter() - t0)
        if req.cancelled:
            self._release(req)
            return
        limit = min(admit.prompt_len + req.sampling.max_tokens, self._max_context())
        seq = RunningSeq(req, pos=admit.prompt_len, last=req.generated[-1], max_pos=limit,
                         stops=stop_ids(req.sampling, self.loaded.config.eos_ids))
        if not admit.oracle:
            self.persister.prompt(seq, admit)
        else:
            seq.persist = False  # oracle: nothing is persisted
        seq.span = tracer.start_span("decode", context=req.ctx, attributes={
            "req_id": req.req_id, "engine": self.engine, "prompt_tokens": admit.prompt_len})
        self.ready.append(seq)
        self.wake.set()

    async def _on_cancel(self, msg: Cancel, d: Delivery) -> None:
        self.cancelled.add(msg.req_id)
        req = self.held.get(msg.req_id)
        log.info("cancel %s (%s)%s", msg.req_id, msg.reason, "" if req else " - not held")
        if req is None:
            return
        req.cancelled = True
        if req in self.waiting:
            self.waiting.remove(req)
            self.admits.pop(req.req_id, None)
            await self.bus.publish(self.subjects.tm(self.engine, "release"), Release(req.req_id))
            self._release(req)
        self.wake.set()

    # decode loop ----------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            self._start_loads()
            self.running += self.ready
            self.ready = []
            for seq in [s for s in self.running if s.req.cancelled]:
                self.running.remove(seq)
                if seq.span is not None:
                    seq.span.set_attribute("finish_reason", "cancelled")
                    seq.span.end()
                self._release(seq.req)
            self.m_batch.set(len(self.running))
            if not self.running:
                self.wake.clear()
                await self.wake.wait()
                continue
            await self._step()

    async def _step(self) -> None:
        batch = list(self.running)
        t0 = time.perf_counter()
        try:
            tokens, lps = await self.worker.run(self._forward, batch)
        except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, not the engine
            log.exception("decode step failed")
            for seq in batch:
                self.running.remove(seq)
                if seq.span is not None:
                    seq.span.record_exception(exc)
                    seq.span.end()
                await self._finish(seq.req, "error", f"decode step failed: {exc}")
            return
        self.m_step.observe(time.perf_counter() - t0)
        self.m_tokens.inc(len(batch))
        out: dict[str, list[TokenEvent]] = {}  # reply subject -> this step's events for it
        for seq, tok, lp in zip(batch, tokens, lps):
            index = seq.index
            seq.req.generated.append(tok)
            seq.pos += 1
            seq.last = tok
            block = filled_block(seq, self.cfg.block_size)
            if block is not None and seq.persist:
                self.persister.generated(seq, block)
            reason = finish_reason(seq, tok)
            if seq.span is not None and (index % STEP_SAMPLE == 1 or reason):
                seq.span.add_event("decode_step", {"index": index, "batch_size": len(batch),
                                                   "step_s": round(time.perf_counter() - t0, 6)})
            out.setdefault(seq.req.reply, []).append(
                TokenEvent(seq.req.req_id, [tok], index, finish=reason, logprobs=[lp] if lp is not None else []))
            if reason:
                if seq.span is not None:
                    seq.span.set_attributes({"completion_tokens": len(seq.req.generated), "finish_reason": reason})
                    seq.span.end()
                self.running.remove(seq)
                self._release(seq.req)
        for reply, events in out.items():  # one message per step per scheduler, not one per sequence
            await self.bus.publish(reply, StepEvents(events, self.engine))

    def _forward(self, batch: list[RunningSeq]) -> tuple[list[int], list[TokenLogprob | None]]:
        """Model thread: one token for every running sequence (and its log-probabilities, for the
        sequences whose request asked for them)."""
        import torch

        from shared.model.batch import ForwardBatch, SeqSlice
        from shared.model.sampling import sample, token_logprobs

        fb = ForwardBatch([SeqSlice([s.last], s.pos, s.req.blocks) for s in batch])
        with torch.inference_mode():
            logits = self.loaded.model.forward(fb, self.kv.cache)
        gens = []
        for s in batch:
            seed = generator_seed(s.req.sampling, s.index)
            gens.append(torch.Generator().manual_seed(seed) if seed is not None else None)
        toks = sample(logits, [s.req.sampling.temperature for s in batch], [s.req.sampling.top_p for s in batch], gens)
        lps = token_logprobs(logits, toks, [s.req.sampling.logprobs for s in batch])
        return toks, [None if lp is None else TokenLogprob(*lp) for lp in lps]

    # helpers ----------------------------------------------------------------------
    async def _finish(self, req: EngineRequest, finish: str, error: str = "", retryable: bool = False) -> None:
        await self.bus.publish(req.reply, TokenEvent(req.req_id, [], len(req.generated), finish=finish, error=error,
                                                     source=self.engine, retryable=retryable))
        self._release(req)

    def _release(self, req: EngineRequest) -> None:
        if self.persister and self.persister.busy(req.req_id):
            self.persister.release_later(req)  # its blocks are still being copied out
            return
        self.held.pop(req.req_id, None)
        self.admits.pop(req.req_id, None)
        if self.kv:
            self.kv.alloc.release(req.req_id)
            self.m_free.labels(self.engine).set(self.kv.alloc.free)
        self.wake.set()


class _Skip(Exception):
    """Internal: the KV load is skipped (oracle mode)."""


def main(argv: list[str] | None = None) -> int:
    return service_main("decode_engine", DecodeConfig, DecodeService, argv)
