"""Decode-engine wiring: admission of handed-off prompts and the continuous-batching loop.

A failed load fails only its request; a decode step never waits on a save."""
from __future__ import annotations

import asyncio
import logging
import time

import msgspec
from opentelemetry import trace

from services.decode_engine.config import DecodeEngineConfig
from services.decode_engine.persist import Persister
from services.decode_engine.running import DecodeRequest, RunningSeq, admit_order, filled_block, finish_reason
from services.decode_engine.states import TERMINAL, DeLife, DeState
from shared.bus import BusError, Delivery, Losses, error_code
from shared.engine.requests import RecentSet, stop_ids
from shared.engine.service import EngineService
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.endpoints import EP
from shared.messages.stream import StepEvents, TokenEvent, TokenLogprob
from shared.messages.traffic_manager import LoadKV, Release
from shared.messages.registry import EngineAnnounce
from shared.messages.work import Ack, Cancel, DecodeAdmit
from shared.runtime import service_main

log = logging.getLogger("decode_engine")
STEP_SAMPLE = 16  # a decode_step event on the request's decode span every this many tokens
tracer = trace.get_tracer("decode_engine")


class DecodeEngineService(EngineService):
    name = "decode_engine"
    role = "decode"
    kv_tag = "de-kv"

    def __init__(self, cfg: DecodeEngineConfig):
        super().__init__(cfg)
        self.held: dict[str, DecodeRequest] = {}  # the live requests (any state but a terminal one)
        self.waiting: list[DecodeRequest] = []  # ADMITTED, in arrival order
        self.ready: list[RunningSeq] = []  # RUNNING, joining the batch at the next step
        self.running: list[RunningSeq] = []  # RUNNING or STOPPING, in the batch
        self.life = DeLife(self.metrics)  # each request's state: the one writer of DecodeRequest.state
        self.cancelled = RecentSet()  # cancels that may arrive before their admission
        self.tm = Losses()  # resolves when its TM is gone: a load waiting on it fails at once
        self.persister: Persister | None = None
        m = self.metrics
        self.m_tokens = m.counter("tokens_total", "Tokens generated")
        self.m_step = m.histogram("step_seconds", "Decode step time (one token per running sequence)")
        self.m_batch = m.gauge("running", "Sequences in the running batch")
        self.m_load = m.histogram("kv_load_seconds", "Buffer -> KV memory copy time")

    async def start(self) -> None:
        await self.load()
        cfg = self.cfg
        self.persister = Persister(self.store, cfg.node, self.bus, self.subjects.at(EP.TM_SAVE, engine=self.engine),
                                   cfg.load_timeout_s, self.spawn, self.metrics, release=self._release,
                                   on_failure=self._background_failed)
        await self.bus.subscribe(self.subjects.at(EP.DE_ADMIT, engine=self.engine), self._on_admit)
        await self.bus.subscribe(self.subjects.at(EP.CANCEL), self._on_cancel)
        await self.watch_tm()
        self.bus.losses.on_reconnect.append(self._reconnected)
        self.spawn(self._loop(), name="decode-loop")

    # admission ----------------------------------------------------------------
    async def _on_admit(self, msg: DecodeAdmit, d: Delivery) -> None:
        if msg.req_id in self.cancelled:
            await d.respond(Ack(False, "request was cancelled", ErrorCode.CANCELLED))
            return
        if msg.prompt_len + 1 > self.max_context():
            await d.respond(Ack(False, f"prompt of {msg.prompt_len} tokens exceeds context {self.max_context()}",
                                ErrorCode.PROMPT_TOO_LONG))
            return
        req = DecodeRequest(msg.req_id, list(msg.prompt), msg.sampling, msg.reply, d.ctx, admit=msg)
        req.connection = self.bus.losses.current()
        req.generated.append(msg.first_token)
        why = await self.persister.claim_prompt(req, msg) if msg.persist else ""  # on its way to the store now
        if why:
            await d.respond(Ack(False, f"prompt not saved: {why}", ErrorCode.CANCELLED))
            return
        self._hold(req)
        await d.respond(Ack())
        self.wake.set()

    def _hold(self, req: DecodeRequest) -> None:
        """An acknowledged request: ADMITTED, in line for KV blocks until `admit_wait_s` at most."""
        self.held[req.req_id] = req
        self.life.enter(req, DeState.ADMITTED, "admitted")
        self.waiting.append(req)
        if self.cfg.admit_wait_s > 0:
            req.timer = asyncio.get_running_loop().call_later(self.cfg.admit_wait_s, self._admit_expired, req)

    def _admit_expired(self, req: DecodeRequest) -> None:
        if req.state is DeState.ADMITTED:
            self.spawn_while_serving(self._drop_waiting(req, f"no KV blocks free within {self.cfg.admit_wait_s:g} s"),
                                     name=f"admit-deadline-{req.req_id}")

    async def _drop_waiting(self, req: DecodeRequest, error: str = "") -> None:
        """An ADMITTED request leaves the line, cancelled or failed (retryable) with `error`."""
        self.waiting.remove(req)
        self._release(req, DeState.FAILED if error else DeState.CANCELLED, error)  # before the awaits
        await self.bus.publish(self.subjects.at(EP.TM_RELEASE, engine=self.engine), Release(req.req_id))
        if error:
            await self.publish_error(req, ErrorCode.NO_ENGINE, error, retryable=True)

    def _limit(self, req: DecodeRequest) -> int:
        """Context limit of the request: prompt + max_tokens, capped by the engine's."""
        return min(req.admit.prompt_len + req.sampling.max_tokens, self.max_context())

    def _start_loads(self) -> None:
        room = self.cfg.max_running - len(self.running) - len(self.ready)
        need = lambda r: self.kv.blocks_for(self._limit(r))  # noqa: E731
        for req in admit_order(self.waiting, self.kv.alloc.free, need, room):
            self._loading(req, self.kv.alloc.allocate(req.req_id, need(req)))
            self.spawn(self._load(req), name=f"load-{req.req_id}")
        self.note_free()

    def _loading(self, req: DecodeRequest, blocks: list[int]) -> None:
        self.waiting.remove(req)
        req.blocks = blocks
        self._move(req, DeState.LOADING)

    async def _load(self, req: DecodeRequest) -> None:
        """Buffer -> KV memory, then the request joins the batch; any failure fails it alone."""
        admit = req.admit
        t0 = time.perf_counter()
        with tracer.start_as_current_span("kv_load", context=req.ctx, attributes={
                "req_id": req.req_id, "blocks": len(admit.buf_slots), "engine": self.engine}) as span:
            try:
                if admit.buf_slots:  # none: the PE pushed nothing, nothing to copy
                    await self._copy_in(req, admit)
                seq = self._join(req, admit)
            except Exception as exc:  # noqa: BLE001 - a failed load fails its request, not the engine
                if not isinstance(exc, BusError):
                    log.exception("KV load of %s failed", req.req_id)
                span.record_exception(exc)
                reason = exc.reason if isinstance(exc, BusError) else f"{type(exc).__name__}: {exc}"
                code = error_code(exc, ErrorCode.KV_TRANSFER if isinstance(exc, BusError) else ErrorCode.INTERNAL)
                await self.fail(req, code, f"KV load failed: {reason}", retryable=True)
                return
        self.m_load.observe(time.perf_counter() - t0)
        if seq is None:
            self._release(req)  # cancelled while loading: STOPPING, ending CANCELLED
            return
        self.ready.append(seq)
        self.wake.set()

    async def _copy_in(self, req: DecodeRequest, admit: DecodeAdmit) -> None:
        n, gone = len(admit.buf_slots), self.tm.current()
        asked = asyncio.ensure_future(self.bus.request(self.subjects.at(EP.TM_LOAD, engine=self.engine), LoadKV(
            req.req_id, admit.buf_slots, req.blocks[:n]), timeout=self.cfg.load_timeout_s))
        await asyncio.wait([asked, gone], return_when=asyncio.FIRST_COMPLETED)
        if not asked.done():  # the TM that was copying died: no answer will come
            asked.cancel()
            raise BusError("load", "its traffic manager restarted", ErrorCode.KV_TRANSFER)
        done = asked.result()
        if not done.ok:
            raise BusError("load", done.error, done.code)
        if self.kv.copies.separate:  # a device cache: the prompt goes up before the sequence joins
            await self.worker.run(self._upload, req.blocks[:n])

    def _upload(self, blocks: list[int]) -> None:
        self.kv.copies.upload(blocks)
        self.kv.copies.finish()

    def _join(self, req: DecodeRequest, admit: DecodeAdmit) -> RunningSeq | None:
        """The running sequence of a loaded request (None: it was cancelled meanwhile)."""
        if req.state is not DeState.LOADING:
            return None
        seq = RunningSeq(req, pos=admit.prompt_len, last=req.generated[-1], max_pos=self._limit(req),
                         stops=stop_ids(req.sampling, self.loaded.config.eos_ids))
        if admit.persist:
            self.persister.prompt(seq, admit)
        else:
            seq.persist = False  # the plan saves nothing
        req.admit = None
        seq.span = req.span = tracer.start_span("decode", context=req.ctx, attributes={
            "req_id": req.req_id, "engine": self.engine, "prompt_tokens": admit.prompt_len})
        self._move(req, DeState.RUNNING)
        return seq

    async def tm_restarted(self) -> None:
        self.tm.lost()  # every load and save waiting on the old TM fails now
        if self.persister is not None:
            self.persister.tm.lost()

    def _reconnected(self) -> None:
        """Back on NATS: a Cancel sent meanwhile may be lost and the scheduler resumes what it placed, so each
        held request ends here, with a retryable error its scheduler ignores when it resumed it already."""
        for req in list(self.held.values()):
            if req.state not in TERMINAL and req.state is not DeState.STOPPING and req.connection.done():
                self.spawn(self.publish_error(req, ErrorCode.ENGINE_FAILED, "its decode engine lost NATS", True))
                self.cancelled.add(req.req_id)
                self.spawn(self._cancel_held(req, "its decode engine lost NATS"), name=f"cancel-{req.req_id}")

    async def _on_cancel(self, msg: Cancel, d: Delivery) -> None:
        self.cancelled.add(msg.req_id)
        req = self.held.get(msg.req_id)
        log.info("cancel %s (%s)%s", msg.req_id, msg.reason, "" if req else " - not held")
        if req is not None:
            await self._cancel_held(req, msg.reason or "cancelled")

    async def _cancel_held(self, req: DecodeRequest, why: str) -> None:
        if req.state is DeState.ADMITTED:
            await self._drop_waiting(req)
        elif req.state in (DeState.LOADING, DeState.RUNNING, DeState.STOPPING):
            self._stop(req, DeState.CANCELLED, why)  # a cancel wins over a failure
        self.wake.set()

    def _background_failed(self, req: DecodeRequest, error: str) -> None:
        if self.held.get(req.req_id) is req and req.state is DeState.RUNNING:
            req.failed = error
            self._stop(req, DeState.FAILED, error)
            self.wake.set()

    def _stop(self, req: DecodeRequest, ending: DeState, why: str) -> None:
        """`req` leaves once the load or step under way is over, ending in `ending`."""
        req.ending = ending
        if req.state is not DeState.STOPPING:
            self._move(req, DeState.STOPPING, why)

    # decode loop ----------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            self._start_loads()
            self.running += self.ready
            self.ready = []
            for seq in [s for s in self.running if s.req.state is DeState.STOPPING]:
                await self._leave(seq)
            self.m_batch.set(self.life.counts[DeState.RUNNING])
            if not self.running:
                self.wake.clear()
                await self.wake.wait()
                continue
            await self._step()

    async def _leave(self, seq: RunningSeq) -> None:
        self.running.remove(seq)
        failed = seq.req.ending is DeState.FAILED
        if seq.span is not None:
            seq.span.set_attribute("finish_reason", FinishReason.ERROR if seq.req.failed else FinishReason.CANCELLED)
            seq.span.end()
        if failed:
            await self.fail(seq.req, ErrorCode.INTERNAL, seq.req.failed, retryable=True)  # only a bug sets it
        else:
            self._release(seq.req, DeState.CANCELLED)

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
                await self.fail(seq.req, ErrorCode.ENGINE_FAILED, f"decode step failed: {exc}")
            return
        self.m_step.observe(time.perf_counter() - t0)
        self.m_tokens.inc(len(batch))
        out: dict[str, list[TokenEvent]] = {}  # reply subject -> this step's events for it
        for seq, tok, lp in zip(batch, tokens, lps):
            ev = self._advance(seq, tok, lp, len(batch), t0)
            out.setdefault(seq.req.reply, []).append(ev)
        for reply, events in out.items():  # one message per step per scheduler, not one per sequence
            await self.bus.publish(reply, StepEvents(events, self.engine))

    def _advance(self, seq: RunningSeq, tok: int, lp: TokenLogprob | None, batch_size: int, t0: float) -> TokenEvent:
        index = seq.index
        seq.req.generated.append(tok)
        seq.pos += 1
        seq.last = tok
        block = filled_block(seq, self.cfg.block_size)
        if block is not None and seq.persist:
            self.persister.generated(seq, block)
        reason = finish_reason(seq, tok)
        if seq.span is not None and (index % STEP_SAMPLE == 1 or reason):
            seq.span.add_event("decode_step", {"index": index, "batch_size": batch_size,
                                               "step_s": round(time.perf_counter() - t0, 6)})
        if reason:
            if seq.span is not None:
                seq.span.set_attributes({"completion_tokens": len(seq.req.generated), "finish_reason": reason})
            self.running.remove(seq)
            self._release(seq.req, DeState.DONE, reason)
            if seq.span is not None:
                seq.span.end()
        return TokenEvent(seq.req.req_id, [tok], index, finish=reason, logprobs=[lp] if lp is not None else [])

    def _forward(self, batch: list[RunningSeq]) -> tuple[list[int], list[TokenLogprob | None]]:
        """Model thread: one token per running sequence, with log-probabilities where asked."""
        import torch

        from shared.engine.sampling import next_tokens
        from shared.model.batch import ForwardBatch, SeqSlice

        fb = ForwardBatch([SeqSlice([s.last], s.pos, s.req.blocks) for s in batch])
        with torch.inference_mode():
            logits = self.loaded.model.forward(fb, self.kv.cache)
        bs = self.cfg.block_size  # blocks this step filled go down to the host region before the TM persists them
        filled = [s.req.blocks[s.pos // bs] for s in batch if s.persist and (s.pos + 1) % bs == 0]
        if filled and self.kv.copies.separate:
            self.kv.copies.download(filled)
            self.kv.copies.finish()
        return next_tokens(logits, [s.req.sampling for s in batch], [s.index for s in batch])

    # helpers ----------------------------------------------------------------------
    async def fail(self, req: DecodeRequest, code: ErrorCode, error: str, retryable: bool = False) -> None:
        try:
            await self.publish_error(req, code, error, retryable)
        finally:
            self._release(req, DeState.FAILED, error)

    def _release(self, req: DecodeRequest, ending: DeState | None = None, why: str = "") -> None:
        """`req` ends in `ending` (None: the pending one); its blocks are freed once its saves copied them."""
        if req.state in TERMINAL:
            return  # released before; its id (and its blocks' owner name) may belong to a newer record
        ending = ending or req.ending or DeState.DONE
        if self.persister and self.persister.busy(req.req_id):
            if req.state is not DeState.PERSISTING:
                req.ending = ending
                self._move(req, DeState.PERSISTING, why)
            self.persister.release_later(req)  # its blocks are still being copied out
            return
        self._move(req, ending, why)
        holder = self.held.get(req.req_id)
        if holder is not None and holder is not req:
            return  # its id (and its blocks' owner name) belongs to a newer record
        self.held.pop(req.req_id, None)
        self.free_blocks(req)

    def _move(self, req: DecodeRequest, dst: DeState, why: str = "") -> None:
        if req.state is DeState.ADMITTED and req.timer is not None:
            req.timer.cancel()  # it leaves the line: its admission deadline with it
            req.timer = None
        self.life.try_move(req, dst, why)

    def announce(self) -> EngineAnnounce:
        """The engine's announcement: `seq` and `tok` read from the live requests' states."""
        live = [r for r in self.held.values() if r.state not in TERMINAL]
        return msgspec.structs.replace(super().announce(), seq=self.life.held(), tok=sum(r.tokens for r in live))


def main(argv: list[str] | None = None) -> int:
    return service_main("decode_engine", DecodeEngineConfig, DecodeEngineService, argv)
