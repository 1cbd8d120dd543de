"""The prefill engine's hand-off: the first token out, then the prompt's KV to a decode engine.

A failed push or admit fails the request as retryable; a prompt no decode engine takes is stored
from here. Never holds the engine itself."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from opentelemetry import trace

from services.prefill_engine.config import PrefillEngineConfig
from services.prefill_engine.fetch import stored_blocks
from services.prefill_engine.life import PeState
from services.prefill_engine.link import PeLink
from services.prefill_engine.metrics import PrefillMetrics
from services.prefill_engine.outcomes import Fail, Free, Outcome
from services.prefill_engine.record import PrefillRequest
from shared.bus import BusError, error_code
from shared.engine.requests import stop_ids
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.endpoints import EP
from shared.messages.stream import TokenEvent, TokenLogprob
from shared.messages.storage_gateway import StoreLayout
from shared.messages.traffic_manager import ForwardAlive, KVWindow, PushDone, PushKV, Release, SaveKV
from shared.messages.work import Ack, DecodeAdmit

log = logging.getLogger("prefill_engine.handoff")
tracer = trace.get_tracer("prefill_engine")


class Handoff:
    def __init__(self, link: PeLink, cfg: PrefillEngineConfig, store: StoreLayout, eos_ids: tuple[int, ...],
                 pm: PrefillMetrics | None = None):
        self.bus, self.subjects, self.engine, self.spawn = link.bus, link.subjects, link.engine, link.spawn
        self.timeout_s, self.node, self.store, self.eos_ids = cfg.handoff_timeout_s, cfg.node, store, eos_ids
        self.pm = pm  # hand-off time, and its tail: from the last layer computed to the last layer landed

    # layerwise push ------------------------------------------------------------------------
    def start_push(self, req: PrefillRequest, expect_s: float = 0.0, layerwise: bool = True) -> None:
        """The final forward is about to start (about `expect_s`): its TM pushes layers as computed; or
        (not `layerwise`) the forward is over and the whole KV goes at once. Either way a task in `req.push`,
        which a TM restart or a client leaving ends at once."""
        work = req.work
        if work is None or not work.plan.push or req.push is not None:
            return
        req.de_held = work.de_engine  # the push may reserve slots there
        msg = push_msg(req, layerwise)
        limit = 2 * (self.timeout_s + expect_s) if layerwise else self.timeout_s  # layerwise: the forward's too
        req.push = self.spawn(self._push(req, msg, limit), name=f"push-{req.req_id}")

    async def keepalive(self, reqs: list[PrefillRequest]) -> None:
        """While their forward runs: keep this engine's TM's waits on it alive (`ForwardAlive`)."""
        ids, subject = [r.req_id for r in reqs], self.subjects.at(EP.TM_ALIVE, engine=self.engine)
        while ids:
            await asyncio.sleep(self.timeout_s / 4)
            await self.bus.publish(subject, ForwardAlive(ids))

    async def _push(self, req: PrefillRequest, msg: PushKV, timeout: float) -> None:
        """The push's outcome into `req.pushed`; never raises (a bus failure is a failed PushDone)."""
        try:
            req.pushed = await self.bus.request(self.subjects.at(EP.TM_PUSH, engine=self.engine), msg,
                                                timeout=timeout, ctx=req.ctx)
        except BusError as exc:
            req.pushed = PushDone(ok=False, error=exc.reason, code=exc.code or ErrorCode.KV_TRANSFER)

    async def abort_push(self, req: PrefillRequest) -> None:
        """End the request's push and wait until its TM no longer reads its blocks."""
        if req.push is None:
            return
        if not req.push.done():
            await self.bus.publish(self.subjects.at(EP.TM_RELEASE, engine=self.engine), Release(req.req_id))
        await asyncio.wait([req.push])

    async def run(self, req: PrefillRequest, first: int, lp: TokenLogprob | None) -> AsyncIterator[Outcome]:
        """The first token, then the hand-off to the DE or the prompt's end here; yields `Free` last."""
        sp = req.sampling
        done = first in stop_ids(sp, self.eos_ids)
        finish = FinishReason.STOP if done else (FinishReason.LENGTH if sp.max_tokens <= 1 else None)
        if not _cancelled(req):
            await self.bus.publish(req.reply, TokenEvent(req.req_id, [first], 0, finish=finish, source=self.engine,
                                                         cached_tokens=req.hit_tokens, tiers=req.tiers,
                                                         logprobs=[lp] if lp is not None else []), ctx=req.ctx)
        if finish or _cancelled(req):
            await self._end_here(req)
        else:
            async for outcome in self._hand_over(req, first):
                yield outcome
        yield Free(req)

    async def _end_here(self, req: PrefillRequest) -> None:
        """Finished here or cancelled: its push ends, its DE slots are freed, the prompt is stored from here."""
        if _cancelled(req):
            await self.abort_push(req)
        elif req.push is not None:
            await asyncio.wait([req.push])  # its TM still reads the blocks
        self.drop_de_slots(req)
        await self.persist(req)

    async def _hand_over(self, req: PrefillRequest, first: int) -> AsyncIterator[Outcome]:
        """Push and admit; a failure fails the request (retryable) and stores the prompt from here."""
        t0 = time.perf_counter()
        work = req.work
        with tracer.start_as_current_span("pd_handoff", context=req.ctx,
                                          attributes={"req_id": req.req_id, "de_engine": work.de_engine}):
            try:
                await self._push_and_admit(req, first)
                req.de_held = ""  # the decode side owns (and frees) its slots now
            except Exception as exc:  # noqa: BLE001 - a failed hand-off fails its request, not the engine
                if not isinstance(exc, BusError):
                    log.exception("hand-off of %s failed", req.req_id)
                reason = exc.reason if isinstance(exc, BusError) else f"{type(exc).__name__}: {exc}"
                if not _cancelled(req):
                    code = error_code(exc, ErrorCode.KV_TRANSFER if isinstance(exc, BusError) else ErrorCode.INTERNAL)
                    yield Fail(req, code, f"KV hand-off to {work.de_engine} failed: {reason}", release=False)
                await self.bus.publish(self.subjects.at(EP.TM_RELEASE, engine=work.de_engine), Release(req.req_id))
                await self.persist(req)  # the DE never took it: the prompt is stored from here
            finally:
                if self.pm is not None:
                    self.pm.handoff.observe(time.perf_counter() - t0)

    def drop_de_slots(self, req: PrefillRequest) -> None:
        engine, req.de_held = req.de_held, ""
        if engine:
            self.spawn(self.bus.publish(self.subjects.at(EP.TM_RELEASE, engine=engine), Release(req.req_id)),
                       name=f"release-de-{req.req_id}")

    async def persist(self, req: PrefillRequest) -> None:
        """Save the prompt's blocks the store lacks; returns once its TM copied them out."""
        work = req.work
        if work is None or not work.plan.persist or req.computed is None:
            return
        bs = self.store.block_size
        n_full = min(len(req.prompt) // bs, len(work.block_keys), len(req.blocks))
        start = min(stored_blocks(req, bs), n_full)  # blocks a short read missed were computed: stored now
        if start >= n_full:
            return
        msg = SaveKV(req.req_id, req.blocks[start:n_full], list(work.block_keys[start:n_full]), self.node, self.store)
        try:
            res = await self.bus.request(self.subjects.at(EP.TM_SAVE, engine=self.engine), msg,
                                         timeout=self.timeout_s, ctx=req.ctx)
        except BusError as exc:
            log.warning("persisting the prompt of %s failed: %s", req.req_id, exc.reason)  # pragma: no mutate
            return
        if res.error:
            log.warning("persisting the prompt of %s: %s", req.req_id, res.error)  # pragma: no mutate

    async def _push_and_admit(self, req: PrefillRequest, first: int) -> None:
        """KV to the DE's buffer (unless the plan pushes none), then the admission; BusError on failure."""
        work = req.work
        if not work.plan.push:
            pushed = PushDone()  # no PD transfer: the DE loads nothing
        else:
            self.start_push(req, layerwise=False)  # a short forward's: the whole KV now (a no-op after layerwise)
            await asyncio.wait([req.push, req.left()], return_when=asyncio.FIRST_COMPLETED)
            await self.abort_push(req)  # its client left: the TM stops it (a no-op once the push is over)
            pushed = req.pushed or PushDone(ok=False, error="the push task failed", code=ErrorCode.INTERNAL)
            if pushed.ok and req.computed_at and self.pm is not None:
                self.pm.tail.observe(time.perf_counter() - req.computed_at)
        if not pushed.ok:
            raise BusError("push", pushed.error, pushed.code)
        if _cancelled(req):
            raise BusError("push", "cancelled", ErrorCode.CANCELLED)
        admit = DecodeAdmit(req.req_id, len(req.prompt), first, req.sampling, req.reply, pushed.slots,
                            pe_engine=self.engine, prompt=req.prompt, block_keys=work.block_keys,
                            persisted_blocks=stored_blocks(req, self.store.block_size), persist=work.plan.persist)
        ack = await self.bus.request(self.subjects.at(EP.DE_ADMIT, engine=work.de_engine), admit,
                                     timeout=self.timeout_s, abort=req.left())  # a DE killed meanwhile never replies
        if not ack.ok:
            raise BusError("admit", ack.error, ack.code)


def push_msg(req: PrefillRequest, layerwise: bool) -> PushKV:
    """The request's push: its blocks to its DE (a hit window's ring, a DE-buffer prefetch adopted there)."""
    work, w = req.work, req.window
    adopt = req.adopt if not req.de_slots else ""  # copied from the DE's buffer: adopted there, not sent
    return PushKV(req.req_id, req.blocks, work.de_engine, len(req.prompt), dst_slots=req.de_slots,
                  skip=req.de_hits, layerwise=layerwise,
                  window=KVWindow(w.hits, list(w.ring), w.layers, w.used) if w else None,
                  adopt=adopt, adopt_block_keys=work.block_keys[:req.adopt_blocks] if adopt else [])


def _cancelled(req: PrefillRequest) -> bool:
    return req.state is PeState.CANCELLING
