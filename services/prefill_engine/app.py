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

from services.prefill_engine.config import PrefillConfig
from services.prefill_engine.layers import LayerGate, LoadError, LoadProgress
from services.scheduler.policy.intra_pe import AttentionModel, plan_batch
from services.scheduler.policy.intra_pe import PrefillWork as Work
from shared.bus import BusError, Delivery
from shared.engine.kv_memory import KVMemory
from shared.engine.requests import EngineRequest, generator_seed, stop_ids
from shared.engine.worker import ModelWorker
from shared.messages.registry import EngineAnnounce
from shared.messages.stream import TokenEvent, TokenLogprob
from shared.engine.store_layout import store_layout
from shared.messages.tm import FetchKV, LayerLoaded, PushDone, PushKV, Release
from shared.messages.work import Ack, Cancel, DecodeAdmit, PrefillWork
from shared.runtime import Service, service_main

log = logging.getLogger("prefill")
tracer = trace.get_tracer("prefill-engine")


class PrefillService(Service):
    name = "prefill-engine"

    def __init__(self, cfg: PrefillConfig):
        super().__init__(cfg)
        self.engine = cfg.engine or f"pe-{cfg.node}-{os.getpid()}"
        self.queue: list[tuple[EngineRequest, PrefillWork]] = []  # ready to compute (hits loaded or none)
        self.fetching: list[tuple[EngineRequest, PrefillWork]] = []  # waiting for blocks / the storage read
        self.loads: dict[str, LoadProgress] = {}  # layer progress of requests loading stored KV
        self.hit_tokens: dict[str, int] = {}  # tokens served from the store, per request
        self.progress: dict[str, int] = {}  # prompt tokens with KV in memory (chunked prefill)
        self.attn_model = AttentionModel(per_pair=cfg.attn_per_pair_s, per_token=cfg.attn_per_token_s,
                                         per_batch=cfg.attn_per_batch_s)
        self.staged: dict[str, tuple[list[int], list[int]]] = {}  # DE path: (DE-buffer slots, blocks in them)
        self.de_held: dict[str, str] = {}  # DE read path: request -> the DE engine whose TM holds slots for it
        self.fetch_deadlines: dict[str, float] = {}  # request -> monotonic time its storage read must report by
        self.store = None
        self.active: dict[str, EngineRequest] = {}
        self.wake = asyncio.Event()
        self._in_step: set[str] = set()  # requests inside the running forward
        self._loading: list[tuple[EngineRequest, PrefillWork]] = []  # storage read in flight
        self.loaded = None
        self.kv: KVMemory | None = None
        self.worker = ModelWorker(cfg.threads, cfg.heap_keep_mb)
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
        self.store = store_layout(self.loaded.model_id, self.loaded.config, self.cfg.block_size)
        await self.bus.subscribe(self.subjects.prefill_work(self.engine), PrefillWork, self._on_work)
        await self.bus.subscribe(self.subjects.prefill_loaded(self.engine), LayerLoaded, self._on_loaded)
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
            total_blocks=kv.alloc.n_slots if kv else 0, kv=kv.layout() if kv else None, store=self.store)

    def _max_context(self) -> int:
        if not self.loaded:
            return 0
        return min(self.loaded.config.max_position, self.cfg.kv_blocks * self.cfg.block_size)

    async def stop(self) -> None:
        for req in list(self.active.values()):
            await self._fail(req, "prefill engine shutting down", retryable=True)
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
        if msg.mode == "oracle":  # no I/O: the hit KV is taken as present (output not meaningful)
            self.hit_tokens[req.req_id] = self._usable_hits(msg) * self.cfg.block_size
            self.queue.append((req, msg))
        elif self._usable_hits(msg):
            self.fetching.append((req, msg))
        else:
            self.queue.append((req, msg))
        self.m_queue.set(len(self.queue) + len(self.fetching))
        self.wake.set()

    def _usable_hits(self, msg: PrefillWork) -> int:
        """Hit blocks worth loading: at least the prompt's last token is always computed."""
        return min(msg.hit_blocks, len(msg.block_keys), (len(msg.prompt) - 1) // self.cfg.block_size)

    def _start_fetches(self) -> None:
        """FIFO: give waiting hit requests their KV blocks and ask the TM to load the hits."""
        kv = self.kv
        while self.fetching and kv.alloc.can_allocate(kv.blocks_for(len(self.fetching[0][0].prompt))):
            req, work = self.fetching.pop(0)
            req.blocks = kv.alloc.allocate(req.req_id, kv.blocks_for(len(req.prompt)))
            n = self._usable_hits(work)
            self.loads[req.req_id] = LoadProgress(req.req_id)
            fetch = FetchKV(req.req_id, work.block_keys[:n], req.blocks[:n], work.read_node or self.cfg.node,
                            self.store, pe_blocks=work.pe_blocks if work.mode == "dualpath" else -1,
                            de_engine=work.de_engine, de_node=work.de_node, prompt_blocks=len(req.blocks))
            self._loading.append((req, work))
            if work.mode == "dualpath" and work.pe_blocks < n:
                self.de_held[req.req_id] = work.de_engine
            self.spawn(self.bus.publish(self.subjects.tm(self.engine, "fetch"), fetch, ctx=req.ctx))
            self.fetch_deadlines[req.req_id] = time.monotonic() + self.cfg.handoff_timeout_s
            self.spawn(self._fetch_deadline(req), name=f"fetch-deadline-{req.req_id}")

    async def _fetch_deadline(self, req: EngineRequest) -> None:
        """Every transfer has a deadline: a storage read that never reports (its traffic-manager died)
        fails the request as retryable; its blocks are freed one more deadline later, when no copy
        of that fetch can still be writing into them. A read the TM reports queued (layer -2)
        gets the queue's wait on top."""
        while (left := self.fetch_deadlines.get(req.req_id, 0.0) - time.monotonic()) > 0:
            await asyncio.sleep(left)
        self.fetch_deadlines.pop(req.req_id, None)
        entry = next((e for e in self._loading if e[0] is req), None)
        if entry is None:
            return
        self._loading.remove(entry)
        if not req.cancelled:
            await self._fail(req, "stored KV did not arrive before the transfer deadline", retryable=True,
                             release=False)
        await asyncio.sleep(self.cfg.handoff_timeout_s)
        self._release(req)

    async def _on_loaded(self, msg: LayerLoaded, d: Delivery) -> None:
        prog = self.loads.get(msg.req_id)
        if prog is None:
            return
        if msg.layer == -2:  # queued behind other storage reads: the deadline waits for the queue
            if (at := self.fetch_deadlines.get(msg.req_id)) is not None:
                self.fetch_deadlines[msg.req_id] = max(at, time.monotonic() + self.cfg.handoff_timeout_s + msg.eta_s)
            return
        if msg.layer >= 0:
            prog.mark(msg.layer)
            req = self.active.get(msg.req_id)
            if req is not None and req.cancelled and self._copies_done(req):
                self._release(req)
            return
        entry = next((e for e in self._loading if e[0].req_id == msg.req_id), None)
        if entry is None:
            return
        self._loading.remove(entry)
        self.hit_tokens[msg.req_id] = msg.blocks * self.cfg.block_size
        if msg.de_slots:
            self.staged[msg.req_id] = (msg.de_slots, msg.de_hits)
        if msg.blocks == 0:
            self.loads.pop(msg.req_id, None)  # a miss after all: compute the whole prompt
        self.queue.append(entry)
        self.wake.set()

    async def _on_cancel(self, msg: Cancel, d: Delivery) -> None:
        req = self.active.get(msg.req_id)
        if req is None:
            return
        req.cancelled = True
        self.queue = [(r, w) for r, w in self.queue if r.req_id != msg.req_id]
        self.fetching = [(r, w) for r, w in self.fetching if r.req_id != msg.req_id]
        if req.req_id in self.loads and any(r.req_id == msg.req_id for r, _ in self._loading):
            return  # the TM is still writing into its blocks: released when the read is done
        if not req.blocks or req.req_id not in self._in_step:
            self._release(req)

    # prefill loop ---------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            self._start_fetches()
            self.queue = [(r, w) for r, w in self.queue if not (r.cancelled and self._drop(r))]
            self.m_queue.set(len(self.queue) + len(self.fetching))
            while self.queue:
                batch = self._pick()
                if not batch:
                    break  # out of KV memory: wait for hand-offs to free blocks
                await self._prefill(batch)

    def _pick(self) -> list[tuple[EngineRequest, PrefillWork, int, int]]:
        """The next forward: (request, work, cached, bsz) chunks planned under the compute quota."""
        kv = self.kv
        ready = []
        for r, w in self.queue:  # FIFO: KV memory for the head first; stop at the first that does not fit
            if not r.blocks:
                need = kv.blocks_for(len(r.prompt))
                if not kv.alloc.can_allocate(need):
                    break
                r.blocks = kv.alloc.allocate(r.req_id, need)
            ready.append((r, w))
        self.m_free.labels(self.engine).set(kv.alloc.free)
        work = [Work(i, self._done(r), len(r.prompt) - self._done(r)) for i, (r, _) in enumerate(ready)]
        chunks = plan_batch(work, self.attn_model, self.cfg.compute_quota_s, align=16,
                            max_tokens=self.cfg.max_batch_tokens)
        return [(ready[c.rid][0], ready[c.rid][1], c.cached, c.bsz) for c in chunks]

    def _done(self, req: EngineRequest) -> int:
        """Tokens of the prompt whose KV is in KV memory (stored hits + computed chunks)."""
        return self.progress.get(req.req_id, self.hit_tokens.get(req.req_id, 0))

    async def _prefill(self, batch: list[tuple[EngineRequest, PrefillWork, int, int]]) -> None:
        spans = [tracer.start_span("prefill_chunk", context=r.ctx, attributes={
            "req_id": r.req_id, "engine": self.engine, "prompt_tokens": len(r.prompt), "cached": c, "bsz": n,
            "batch_size": len(batch)}) for r, _, c, n in batch]
        # one forward serves the whole batch: its own span, linked to every request it computes
        step_span = tracer.start_span("prefill_batch", links=[trace.Link(sp.get_span_context()) for sp in spans],
                                      attributes={"engine": self.engine, "batch_size": len(batch),
                                                  "tokens": sum(n for *_, n in batch)})
        self._in_step = {r.req_id for r, *_ in batch}
        t0 = time.perf_counter()
        try:
            firsts = await self.worker.run(self._forward, batch)
        except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, not the engine
            log.exception("prefill step failed")
            step_span.end()
            for (r, *_), span in zip(batch, spans):
                span.record_exception(exc)
                span.end()
                self.queue = [(q, w) for q, w in self.queue if q is not r]
                await self._fail(r, f"prefill failed: {exc}", retryable=isinstance(exc, LoadError))
            return
        finally:
            self._in_step = set()
        self.m_step.observe(time.perf_counter() - t0)
        step_span.end()
        for (r, w, c, n), span, tok in zip(batch, spans, firsts):
            if r.cancelled:
                span.end()
                self.queue = [(q, x) for q, x in self.queue if q is not r]
                self._drop(r)
                continue
            self.progress[r.req_id] = c + n
            self.m_tokens.inc(n)
            prog = self.loads.get(r.req_id)
            span.set_attributes({"hit_tokens": self.hit_tokens.get(r.req_id, 0),
                                 "layer_wait_s": prog.waited_s if prog else 0.0})
            span.end()
            if tok is None:
                continue  # chunked prefill: the rest of the prompt in a later forward
            self.queue = [(q, x) for q, x in self.queue if q is not r]
            self.m_requests.inc()
            self.spawn(self._handoff(r, w, *tok), name=f"handoff-{r.req_id}")
        self.m_queue.set(len(self.queue) + len(self.fetching))

    def _forward(self, batch: list[tuple[EngineRequest, PrefillWork, int, int]]
                 ) -> list[tuple[int, TokenLogprob | None] | None]:
        """Model thread: one batched forward of the chunks; the first token of each finished prompt
        (with its log-probabilities when the request asked for them)."""
        import torch

        from shared.model.batch import ForwardBatch, SeqSlice
        from shared.model.sampling import sample, token_logprobs

        fb = ForwardBatch([SeqSlice(r.prompt[c:c + n], c, r.blocks) for r, _, c, n in batch])
        gate = LayerGate([self.loads[r.req_id] for r, *_ in batch if r.req_id in self.loads],
                         self.cfg.handoff_timeout_s)
        with torch.inference_mode():
            logits = self.loaded.model.forward(fb, self.kv.cache, gate)
        last = [i for i, (r, _, c, n) in enumerate(batch) if c + n >= len(r.prompt)]
        if not last:
            return [None] * len(batch)
        reqs = [batch[i][0] for i in last]
        gens = []
        for r in reqs:
            seed = generator_seed(r.sampling, 0)
            gens.append(torch.Generator().manual_seed(seed) if seed is not None else None)
        toks = sample(logits[last], [r.sampling.temperature for r in reqs], [r.sampling.top_p for r in reqs], gens)
        lps = token_logprobs(logits[last], toks, [r.sampling.logprobs for r in reqs])
        out: list[tuple[int, TokenLogprob | None] | None] = [None] * len(batch)
        for i, t, lp in zip(last, toks, lps):
            out[i] = (t, None if lp is None else TokenLogprob(*lp))
        return out

    # hand-off ---------------------------------------------------------------
    async def _handoff(self, req: EngineRequest, work: PrefillWork, first: int, lp: TokenLogprob | None) -> None:
        sp = req.sampling
        done = first in stop_ids(sp, self.loaded.config.eos_ids)
        finish = "stop" if done else ("length" if sp.max_tokens <= 1 else "")
        cached = self.hit_tokens.get(req.req_id, 0)
        await self._emit(TokenEvent(req.req_id, [first], 0, finish=finish, source=self.engine, cached_tokens=cached,
                                    logprobs=[lp] if lp is not None else []), req)
        if finish or req.cancelled:
            self._drop_de_slots(req)  # finished here (e.g. one token): the DE never loads them
            self._release(req)
            return
        t0 = time.perf_counter()
        with tracer.start_as_current_span("pd_handoff", context=req.ctx,
                                          attributes={"req_id": req.req_id, "de_engine": work.de_engine}):
            try:
                if work.mode == "oracle":
                    pushed = PushDone()  # no PD transfer in the oracle mode
                else:
                    slots, skip = self.staged.get(req.req_id, ([], []))
                    pushed = await self.bus.request(
                        self.subjects.tm(self.engine, "push"),
                        PushKV(req.req_id, req.blocks, work.de_engine, len(req.prompt), dst_slots=slots, skip=skip),
                        PushDone, timeout=self.cfg.handoff_timeout_s)
                if not pushed.ok:
                    raise BusError("push", pushed.error)
                if req.cancelled:
                    raise BusError("push", "cancelled")
                admit = DecodeAdmit(req.req_id, len(req.prompt), first, sp, req.reply, pushed.slots,
                                    pe_engine=self.engine, prompt=req.prompt, block_keys=work.block_keys,
                                    persisted_blocks=work.hit_blocks, oracle=work.mode == "oracle")
                ack = await self.bus.request(self.subjects.decode_admit(work.de_engine), admit, Ack,
                                             timeout=self.cfg.handoff_timeout_s)
                if not ack.ok:
                    raise BusError("admit", ack.error)
                self.de_held.pop(req.req_id, None)  # the decode side owns (and frees) its slots now
            except BusError as exc:
                if not req.cancelled:
                    await self._fail(req, f"KV hand-off to {work.de_engine} failed: {exc.reason}", retryable=True)
                await self.bus.publish(self.subjects.tm(work.de_engine, "release"), Release(req.req_id))
            finally:
                self._release(req)
                self.m_handoff.observe(time.perf_counter() - t0)

    # helpers ----------------------------------------------------------------
    async def _emit(self, ev: TokenEvent, req: EngineRequest) -> None:
        await self.bus.publish(req.reply, ev, ctx=req.ctx)

    def _drop_de_slots(self, req: EngineRequest) -> None:
        """The DE buffer slots staged for a request that will not reach that DE: free them."""
        if engine := self.de_held.pop(req.req_id, None):
            self.spawn(self.bus.publish(self.subjects.tm(engine, "release"), Release(req.req_id)),
                       name=f"release-de-{req.req_id}")

    async def _fail(self, req: EngineRequest, error: str, retryable: bool = False, release: bool = True) -> None:
        self._drop_de_slots(req)
        await self.bus.publish(req.reply, TokenEvent(req.req_id, [], finish="error", error=error, source=self.engine,
                                                     retryable=retryable))
        if not release:
            return
        self._release(req)

    def _copies_done(self, req: EngineRequest) -> bool:
        """No storage read or layer copy still targets this request's KV blocks."""
        prog = self.loads.get(req.req_id)
        if any(r.req_id == req.req_id for r, _ in self._loading):
            return False
        hits = self.hit_tokens.get(req.req_id, 0)
        return prog is None or hits == 0 or prog.layers >= self.loaded.config.n_layers

    def _drop(self, req: EngineRequest) -> bool:
        """Cancelled and queued: release now, or when its last layer copy lands."""
        if self._copies_done(req):
            self._release(req)
        else:  # the last layer copy frees it; the deadline does if that copy never comes
            self.spawn(self._release_after_deadline(req), name=f"release-{req.req_id}")
        return True

    async def _release_after_deadline(self, req: EngineRequest) -> None:
        await asyncio.sleep(self.cfg.handoff_timeout_s)
        if self.active.get(req.req_id) is req:
            self._release(req)

    def _release(self, req: EngineRequest) -> None:
        self.active.pop(req.req_id, None)
        self.loads.pop(req.req_id, None)
        self.hit_tokens.pop(req.req_id, None)
        self.staged.pop(req.req_id, None)
        self.de_held.pop(req.req_id, None)
        self.progress.pop(req.req_id, None)
        if self.kv:
            self.kv.alloc.release(req.req_id)
            self.m_free.labels(self.engine).set(self.kv.alloc.free)
        req.blocks = []
        self.wake.set()


def main(argv: list[str] | None = None) -> int:
    return service_main("prefill_engine", PrefillConfig, PrefillService, argv)
