"""Stored-KV loading for the prefill engine: a request's storage read, its deadline and its reports.

A failure before the read finished is a miss; after it, it fails the load. Never holds the
engine: each step returns what should happen to the request (outcomes.py)."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from opentelemetry import trace

from services.prefill_engine import memory
from services.prefill_engine.batching import attention_model, one_forward
from services.prefill_engine.config import PrefillEngineConfig
from services.prefill_engine.layers import LoadProgress
from services.prefill_engine.life import PeState
from services.prefill_engine.link import PeLink
from services.prefill_engine.outcomes import Abandon, Fail, Free, LoadFailed, Outcome, Ready, Send
from services.prefill_engine.record import PrefillRequest
from services.prefill_engine.staged_copy import StagedCopier
from shared.engine.kv_memory import KVMemory
from shared.messages.codes import ErrorCode
from shared.messages.endpoints import EP
from shared.messages.storage_gateway import StoreLayout
from shared.messages.traffic_manager import (FetchFailed, FetchKV, FetchProgress, KVWindow, LayersLoaded,
                                             ReadFinished, ReadQueued, Release)

log = logging.getLogger("prefill_engine.fetch")
tracer = trace.get_tracer("prefill_engine")


def stored_blocks(req: PrefillRequest, block_size: int) -> int:
    """The prompt's leading blocks the store holds: the plan's count if the read found them all."""
    found = req.hit_tokens // block_size
    return found if found < req.loads.hits else max(found, req.loads.stored)


class Fetcher:
    def __init__(self, link: PeLink, cfg: PrefillEngineConfig, store: StoreLayout, kv: KVMemory, metrics=None):
        self.bus, self.subjects, self.engine, self.spawn = link.bus, link.subjects, link.engine, link.spawn
        self.subject = self.subjects.at(EP.TM_FETCH, engine=self.engine)  # this engine's TM's fetch
        self.copier = StagedCopier(kv)
        self.m_direct = metrics.counter(  # the prefetched blocks copied straight from the TM buffer, or refused there
            "staged_copy_blocks_total", "Prefetched blocks copied straight from a TM buffer on this host (copied), "
            "or refused there (their entry went: fetched instead)", ("outcome",)) if metrics is not None else None
        self.cfg, self.store, self.kv, self.n_layers = cfg, store, kv, store.n_layers
        self.attn = attention_model(cfg)
        self.waiting: list[PrefillRequest] = []  # hit requests waiting for KV blocks (FIFO)

    def start(self) -> list[Outcome]:
        """FIFO: KV blocks and a storage read (`Send`) for waiting requests, or a direct copy (`Ready`)."""
        kv, cfg, out = self.kv, self.cfg, []
        while self.waiting:
            req = self.waiting[0]
            ld = req.loads
            n = ld.hits
            # every hit prefetched (staged in a buffer during the tool call): its layers need no read
            # to wait for, so they come in whole rather than a window's layers at a time (the window's
            # per-layer hand-offs cost a prefetched turn 1.4x the no-I/O bound's TTFT on the tiny model);
            # prefetched into a buffer this engine maps (its own TM's, a same-host one's): one copy, no message
            staged = bool(ld.staged_engine) and ld.staged >= n
            fits = one_forward(cfg, self.attn, n * cfg.block_size, len(req.prompt))
            if not memory.allocate(kv, req, n, cfg.hit_window_layers if fits and not staged else 0, self.n_layers):
                return out
            self.waiting.pop(0)
            req.load = LoadProgress(req.req_id, req.window)
            if ld.pe_blocks < n or (ld.staged and ld.staged_engine == req.work.de_engine):
                req.de_held = req.work.de_engine  # DE-buffer slots are reserved for it (adopted prefetches too)
            fetch = self._fetch_kv(req, n)
            if staged and ld.staged_slots is not None and (done := self._direct(req, fetch)) is not None:
                out += done
                continue
            req.deadline = time.monotonic() + cfg.handoff_timeout_s
            out.append(Send(req, fetch))
        return out

    def _fetch_kv(self, req: PrefillRequest, n: int) -> FetchKV:
        work, ld, w = req.work, req.loads, req.window
        return FetchKV(req.req_id, work.block_keys[:n], req.blocks[:n], ld.node or self.cfg.node,
                       self.store, min(ld.pe_blocks, n), de_engine=work.de_engine, de_node=ld.de_node,
                       prompt_blocks=len(req.blocks), staged_engine=ld.staged_engine,
                       staged_owner=ld.staged_owner, staged_blocks=min(ld.staged, n),
                       window=KVWindow(w.hits, list(w.ring), w.layers) if w else None)

    def _direct(self, req: PrefillRequest, fetch: FetchKV) -> list[Outcome] | None:
        """Copy hits from a TM buffer this engine maps; None when the entry went meanwhile (fetch as
        usual)."""
        n, ld = len(fetch.block_keys), req.loads
        with tracer.start_as_current_span("kv_staged_copy", context=req.ctx, attributes={
                "req_id": req.req_id, "blocks": n, "prefetched_blocks": n, "read_at_arrival_blocks": 0,
                "bytes": n * self.copier.block_nbytes}) as span:
            ok = self.copier.copy(ld.staged_slots, fetch.dst_blocks)
            span.set_attribute("ok", ok)
        if self.m_direct is not None:
            self.m_direct.labels("copied" if ok else "refused").inc(n)
        if not ok:
            return None
        if ld.staged_engine == req.work.de_engine != self.engine:
            req.adopt, req.adopt_blocks = ld.staged_owner, n
        else:
            self.spawn(self.bus.publish(self.subjects.at(EP.TM_RELEASE, engine=ld.staged_engine),
                                        Release(ld.staged_owner, used=n)), name=f"release-staged-{req.req_id}")
        return self._read_done(req, ReadFinished(req.req_id, n, layers=self.n_layers, staged=n))

    async def send(self, req: PrefillRequest, fetch: FetchKV) -> AsyncIterator[Outcome]:
        """One that cannot be sent fails now, not at the deadline."""
        try:
            await self.bus.publish(self.subject, fetch, ctx=req.ctx)
        except Exception as exc:  # noqa: BLE001 - the read was never asked for: fail it now, not at the deadline
            log.warning("fetch of %s not sent: %s", req.req_id, exc)
            if req.read_pending:
                req.load.reading = False
                req.cancel_timer()
                yield Fail(req, ErrorCode.STORAGE, f"storage read not sent: {exc}")

    async def deadline(self, req: PrefillRequest) -> AsyncIterator[Outcome]:
        """A read that never reports fails the request (retryable); its blocks are freed a deadline
        later."""
        while (left := req.deadline - time.monotonic()) > 0:
            await asyncio.sleep(left)
        if not req.read_pending:
            return
        req.load.reading = False
        reason = "stored KV did not arrive before the transfer deadline"
        req.load.fail(reason)
        if req.state is PeState.READING:
            yield Fail(req, ErrorCode.STORAGE, reason, release=False)
        await asyncio.sleep(self.cfg.handoff_timeout_s)
        yield Free(req)

    def on_progress(self, req: PrefillRequest, msg: FetchProgress) -> list[Outcome]:
        if req.load is None or req.load.error:
            return []
        match msg:
            case ReadQueued(eta_s=eta):  # behind other storage reads: the deadline waits for the queue
                req.deadline = max(req.deadline, time.monotonic() + self.cfg.handoff_timeout_s + eta)
            case ReadFinished():
                if req.read_pending:
                    return self._read_done(req, msg)
            case LayersLoaded(layer=layer):
                done = req.copies_done(self.n_layers)
                req.load.mark(layer)
                if req.state in (PeState.CANCELLED, PeState.FAILED) and not done and req.copies_done(self.n_layers):
                    return [Free(req)]  # it waited for its last copy to land
            case FetchFailed():
                return self._fetch_failed(req, msg)
        return []

    def _fetch_failed(self, req: PrefillRequest, msg: FetchFailed) -> list[Outcome]:
        if req.read_pending:  # nothing reached KV memory yet: a miss after all
            log.warning("fetch of %s failed before its read finished (%s: %s); computing the prompt",
                        req.req_id, msg.code, msg.error)
            return self._read_done(req, ReadFinished(req.req_id, 0))
        if msg.layers:
            req.load.mark(msg.layers - 1)
        if req.load.layers >= self.n_layers:
            return []  # every layer is in place already: nothing waits on the rest
        req.cancel_timer()
        req.load.fail(msg.error, msg.code)  # a forward waiting on its next layer raises now
        return [LoadFailed(req, msg.code, f"stored KV load failed: {msg.error}")]

    def _read_done(self, req: PrefillRequest, msg: ReadFinished) -> list[Outcome]:
        req.load.reading = False
        req.cancel_timer()
        req.hit_tokens = msg.blocks * self.cfg.block_size
        req.staged_hits, req.de_read_hits = min(msg.staged, msg.blocks), min(msg.de_read, msg.blocks)
        if msg.de_slots:
            req.de_slots, req.de_hits = list(msg.de_slots), list(msg.de_hits)
        if not memory.fill_short_read(self.kv, req, msg.blocks):
            return [Abandon(req, ErrorCode.BUFFER_FULL, "no KV memory for the blocks a short read missed")]
        if msg.blocks == 0:
            req.load = None  # a miss after all: compute the whole prompt
        else:
            req.load.blocks, req.load.window = req.blocks[:msg.blocks], req.window  # where its layers land
            req.load.expect(msg.eta_s)  # a layer's wait counts from the read's expected end at the earliest
            if msg.layers:  # copied before the report (every hit was prefetched into this engine's buffer)
                req.load.mark(msg.layers - 1)
        return [Ready(req, msg.eta_s)]

    def drop(self, req: PrefillRequest) -> None:
        self.waiting = [r for r in self.waiting if r is not req]
