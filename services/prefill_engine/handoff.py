"""The prefill engine's hand-off: the first token out, then the prompt's KV to a decode engine.

Sequence for one prompt:
  its final forward starts -> PushKV(layerwise) to this engine's TM (`start_push`): layer l of
  its KV goes to the DE's buffer while layer l + 1 computes (the forward reports each layer)
  -> the forward ends: TokenEvent(first token) on the request's output subject -> PushDone
  (the last layer has landed) -> DecodeAdmit to the DE -> Ack -> the DE owns the request; its
  blocks here are freed. A prompt that finished at its first token waits for its push too
  (its blocks are being read), then frees the DE-buffer slots. A forward that failed ends its
  pushes (`abort_push`: Release to this TM) before its blocks are freed.
A failed push or admit fails the request as retryable (its scheduler resumes it) and frees
the DE-buffer slots it held. A prompt the decode engine never takes (its only token came
from the prefill: max_tokens 1, an end-of-sequence token; cancelled; a failed hand-off) is
persisted from here instead: its full blocks the store lacks go to this engine's TM
(`SaveKV`, this node's gateway writes them) before its KV blocks are freed -- every
prompt is stored, whatever ends it. Receives the engine's link to the mesh, never the engine
itself: `run` yields what should happen to the request (outcomes.py) as it comes, the engine does it.
"""
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
from shared.messages.codes import ErrorCode, FinishReason, LoadMode
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
    def start_push(self, req: PrefillRequest, expect_s: float = 0.0) -> None:
        """The prompt's final forward is about to start (computing for about `expect_s`, at the measured
        rate): its TM sends each layer on as it is computed."""
        work = req.work
        if work is None or work.mode == LoadMode.ORACLE or req.push is not None:
            return
        req.de_held = work.de_engine  # the push may reserve slots there
        w = req.window
        adopt = req.adopt if not req.de_slots else ""  # copied from the DE's buffer: adopted there, not sent
        msg = PushKV(req.req_id, req.blocks, work.de_engine, len(req.prompt), dst_slots=req.de_slots,
                     skip=req.de_hits, layerwise=True,
                     window=KVWindow(w.hits, list(w.ring), w.layers, w.used) if w else None,
                     adopt=adopt, adopt_block_keys=work.block_keys[:req.adopt_blocks] if adopt else [])
        req.push = self.spawn(self._push(req, msg, 2 * (self.timeout_s + expect_s)), name=f"push-{req.req_id}")

    async def keepalive(self, reqs: list[PrefillRequest]) -> None:
        """While their forward runs (cancelled when it ends): this engine's TM hears every quarter of
        the deadline that it is alive (`ForwardAlive`), so a push waiting on a layer,
        and a fetch whose window waits on that push, restart their deadlines however long the
        forward computes or waits for other requests' reads; when the engine dies, they stop."""
        ids, subject = [r.req_id for r in reqs], self.subjects.at(EP.TM_ALIVE, engine=self.engine)
        while ids:
            await asyncio.sleep(self.timeout_s / 4)
            await self.bus.publish(subject, ForwardAlive(ids))

    async def _push(self, req: PrefillRequest, msg: PushKV, timeout: float) -> None:
        """The push's outcome into `req.pushed`; never raises (a bus failure is a failed PushDone). The
        TM answers every push (its waits give up once the forward stops moving): `timeout`, which
        grows with the forward's expected time, is for a TM gone."""
        try:
            req.pushed = await self.bus.request(self.subjects.at(EP.TM_PUSH, engine=self.engine), msg,
                                                timeout=timeout, ctx=req.ctx)
        except BusError as exc:
            req.pushed = PushDone(ok=False, error=exc.reason, code=exc.code or ErrorCode.KV_TRANSFER)

    async def abort_push(self, req: PrefillRequest) -> None:
        """End the request's push (its forward failed, or it was cancelled) and wait until its TM
        no longer reads its blocks."""
        if req.push is None:
            return
        if not req.push.done():
            await self.bus.publish(self.subjects.at(EP.TM_RELEASE, engine=self.engine), Release(req.req_id))
        await asyncio.wait([req.push])

    async def run(self, req: PrefillRequest, first: int, lp: TokenLogprob | None) -> AsyncIterator[Outcome]:
        """The first token out, then the KV to the DE and its admission there; or, the prompt ending here
        (one token, its end of sequence, cancelled), its end here. Ends by yielding `Free`."""
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
        """Finished here (e.g. one token) or cancelled: its push ends, its DE never loads the slots
        staged for it, and the prompt is stored from here."""
        if _cancelled(req):
            await self.abort_push(req)
        elif req.push is not None:
            await asyncio.wait([req.push])  # its TM still reads the blocks
        self.drop_de_slots(req)
        await self.persist(req)

    async def _hand_over(self, req: PrefillRequest, first: int) -> AsyncIterator[Outcome]:
        """Push and admit; a failure fails the request (retryable), frees the DE-buffer slots it held,
        and stores the prompt from here (the DE never took it)."""
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
        """The DE buffer slots staged for a request that will not reach that DE: free them."""
        engine, req.de_held = req.de_held, ""
        if engine:
            self.spawn(self.bus.publish(self.subjects.at(EP.TM_RELEASE, engine=engine), Release(req.req_id)),
                       name=f"release-de-{req.req_id}")

    async def persist(self, req: PrefillRequest) -> None:
        """Save the prompt's full blocks the store lacks from this engine's KV memory (its TM copies
        them out, then this node's gateway writes them); returns once they are copied out."""
        work = req.work
        if work is None or work.mode == LoadMode.ORACLE or req.computed is None:
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
            log.warning("persisting the prompt of %s failed: %s", req.req_id, exc.reason)
            return
        if res.error:
            log.warning("persisting the prompt of %s: %s", req.req_id, res.error)

    async def _push_and_admit(self, req: PrefillRequest, first: int) -> None:
        """KV to the DE's buffer (none in the oracle mode), then the admission; BusError on failure."""
        work = req.work
        if work.mode == LoadMode.ORACLE:
            pushed = PushDone()  # no PD transfer in the oracle mode
        elif req.push is not None:  # sent layer by layer during the forward
            await asyncio.wait([req.push])
            pushed = req.pushed or PushDone(ok=False, error="the push task failed", code=ErrorCode.INTERNAL)
            if pushed.ok and req.computed_at and self.pm is not None:
                self.pm.tail.observe(time.perf_counter() - req.computed_at)
        else:
            pushed = await self.bus.request(
                self.subjects.at(EP.TM_PUSH, engine=self.engine),
                PushKV(req.req_id, req.blocks, work.de_engine, len(req.prompt), dst_slots=req.de_slots,
                       skip=req.de_hits), timeout=self.timeout_s)
        if not pushed.ok:
            raise BusError("push", pushed.error, pushed.code)
        if _cancelled(req):
            raise BusError("push", "cancelled", ErrorCode.CANCELLED)
        admit = DecodeAdmit(req.req_id, len(req.prompt), first, req.sampling, req.reply, pushed.slots,
                            pe_engine=self.engine, prompt=req.prompt, block_keys=work.block_keys,
                            persisted_blocks=stored_blocks(req, self.store.block_size), oracle=work.mode == LoadMode.ORACLE)
        ack = await self.bus.request(self.subjects.at(EP.DE_ADMIT, engine=work.de_engine), admit,
                                     timeout=self.timeout_s)
        if not ack.ok:
            raise BusError("admit", ack.error, ack.code)


def _cancelled(req: PrefillRequest) -> bool:
    """Its client left while it was being handed off (checked anew after every wait)."""
    return req.state is PeState.CANCELLING
