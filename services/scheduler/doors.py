"""The dispatch core's side of the front-door workers: their processes and their messages.

A worker's `Submit` becomes an `InFlight` queued exactly as one of the core's own handlers; the
core reaches it through `Relay`. A worker that exits is restarted and its requests forgotten."""
from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import weakref

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST

from services.scheduler.inflight import InFlight
from services.scheduler.lifecycle import ReqState
from shared.bus import Delivery
from shared.kv.keyrun import KeyRun
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.endpoints import EP
from shared.messages.front import Answer, Ask, Done, FrontInfo, PrefillOver, Submit
from shared.messages.stream import TokenEvent

log = logging.getLogger("scheduler.doors")
RESTART_S = 1.0  # pause before a worker that exited is started again


class Relay:
    """A worker's request's event queue, at the core: each event goes to the worker's subject."""

    def __init__(self, doors: "FrontDoors", rec: InFlight):
        self.doors, self.rec = doors, weakref.ref(rec)  # (no cycle with the request: freed when it is done)

    def put_nowait(self, ev: TokenEvent) -> None:
        rec = self.rec()
        if rec is None:
            return
        ev = msgspec.structs.replace(ev, req_id=rec.wire_id, index=0)
        self.doors.svc.spawn(self.doors.svc.bus.publish(rec.reply, ev), name=f"relay-{rec.req_id}")


def strand_event(rec: InFlight, engine: str, why: str) -> TokenEvent:
    """What tells a worker that an engine holding its request went silent."""
    return TokenEvent(rec.req_id, [], finish=FinishReason.ERROR, error=why, source=engine, retryable=True,
                      code=ErrorCode.ENGINE_FAILED)


class FrontDoors:
    def __init__(self, svc):
        self.svc = svc
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.stopping = False
        self.up: set[int] = set()  # workers heard from (their heartbeat)
        self.all_up = asyncio.Event()
        self.failed: asyncio.Future | None = None  # set when one could not start (start())
        self.admitting: dict[str, tuple[InFlight, list]] = {}  # hit lookup under way: (it, its messages meanwhile)

    async def start(self) -> None:
        svc = self.svc
        self.failed = asyncio.get_running_loop().create_future()
        await svc.bus.subscribe(svc.subjects.at(EP.SCHED_FRONT, scheduler=svc.instance), self._on_front)
        await svc.bus.subscribe(svc.subjects.at(EP.SCHED_ASK, scheduler=svc.instance), self._on_ask)
        await svc.bus.subscribe(svc.subjects.at(EP.SCHED_WORKERS, scheduler=svc.instance), self._on_worker)
        svc.spawn(self._publish_info(), name="front-info")
        for i in range(svc.cfg.front_workers):
            svc.spawn(self._run_worker(i), name=f"front-worker-{i}")
        up = asyncio.ensure_future(self.all_up.wait())
        await asyncio.wait([up, self.failed], return_when=asyncio.FIRST_COMPLETED)  # as a bad model fails the core
        up.cancel()
        if self.failed.done():
            raise self.failed.result()

    async def stop(self) -> None:
        self.stopping = True
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except asyncio.TimeoutError:
                proc.kill()

    def info(self) -> FrontInfo:
        v = self.svc.view
        return FrontInfo(self.svc.model_id(), v.model_ids(), v.max_context(), v.store_layout())

    # the worker processes --------------------------------------------------------------------
    async def _run_worker(self, i: int) -> None:
        svc, fd = self.svc, self.svc.http_sock.fileno()
        settings = msgspec.json.encode(svc.cfg)
        while not self.stopping:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "services.scheduler.worker", "--core", svc.instance, "--index", str(i),
                "--fd", str(fd), stdin=asyncio.subprocess.PIPE, pass_fds=(fd,))
            self.procs[i] = proc
            try:
                proc.stdin.write(settings)
                await proc.stdin.drain()
                proc.stdin.close()
                code = await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
            if self.stopping:
                return
            if i not in self.up and not self.failed.done():  # never came up: the service cannot start
                self.failed.set_result(RuntimeError(f"front-door worker {i} exited with code {code} at start "
                                                    "(its log says why)"))
                return
            subject = svc.subjects.at(EP.SCHED_OUT, scheduler=f"{svc.instance}-w{i}")
            lost = [rec for rec in svc.inflight.values() if rec.reply == subject]
            log.error("front-door worker %d exited (code %s) holding %d requests; restarting", i, code, len(lost))
            for rec in lost:
                svc.spawn(svc._cancel(rec.wire_id, "front-door worker exited"))
                svc.finish(rec, "error")
            for rec, held in self.admitting.values():
                if rec.reply == subject:  # finished as soon as it is queued
                    held.append(Done(rec.req_id, "error"))
            await asyncio.sleep(RESTART_S)

    async def _publish_info(self) -> None:
        subject = self.svc.subjects.at(EP.SCHED_INFO, scheduler=self.svc.instance)
        while True:
            await self.svc.bus.publish(subject, self.info())
            await asyncio.sleep(self.svc.cfg.heartbeat_s)

    async def _on_worker(self, msg, d: Delivery) -> None:
        index = msg.instance.rpartition("-w")[2]
        if index.isdigit() and not msg.leaving:
            self.up.add(int(index))
            if len(self.up) >= self.svc.cfg.front_workers:
                self.all_up.set()

    # their messages ----------------------------------------------------------------------------
    async def _on_ask(self, msg: Ask, d: Delivery) -> None:
        svc = self.svc
        if msg.what == "health":
            ok, body = await svc.health()
            answer = Answer(200 if ok else 503, json.dumps(body).encode())
        elif msg.what == "mesh":
            answer = Answer(body=json.dumps(await svc.mesh()).encode())
        elif msg.what == "metrics":
            answer = Answer(body=svc.metrics.render(), content_type=CONTENT_TYPE_LATEST)
        elif msg.what == "close_session":
            await svc.end_session(msg.session)
            answer = Answer()
        else:
            answer = Answer()
        answer.info = self.info()
        await d.respond(answer)

    async def _on_front(self, msg, d: Delivery) -> None:
        svc = self.svc
        if isinstance(msg, Submit):
            await self._submit(msg, d)
            return
        held = self.admitting.get(msg.req_id)
        if held is not None:  # after its admission, in order
            held[1].append(msg)
            return
        rec = svc.inflight.get(msg.req_id)
        if rec is not None:
            self._apply(rec, msg)

    def _apply(self, rec: InFlight, msg) -> None:
        svc = self.svc
        if isinstance(msg, PrefillOver):
            if msg.attempt == rec.attempt:  # the attempt's prefill engine is free, its reads are over
                svc._prefill_over(rec)
        elif isinstance(msg, Done):
            rec.tokens, rec.next_index, rec.cached_tokens = msg.tokens, len(msg.tokens), msg.cached_tokens
            rec.tiers = msg.tiers
            if msg.ttft_s:
                rec.first_at = rec.arrived + msg.ttft_s
                rec.last_at = rec.first_at + msg.tpot_s * max(0, rec.next_index - 1)
            svc.finish(rec, msg.status)

    async def _submit(self, msg: Submit, d: Delivery) -> None:
        svc, now = self.svc, time.monotonic()
        rec = svc.inflight.get(msg.req_id)
        if msg.attempt == 0:
            if rec is not None or msg.req_id in self.admitting:
                return  # a duplicate
            rec = InFlight(msg.req_id, msg.prompt, msg.sampling, ctx=d.ctx, mode=msg.mode, hint=msg.hint,
                           arrived=now - msg.waited_s, queued_at=now - msg.waited_s, block_keys=KeyRun(msg.block_keys),
                           reply=msg.reply, remote_prompt=0 if msg.prompt else msg.prompt_tokens,
                           stored_blocks=msg.stored_blocks)
            rec.events = Relay(self, rec)
            if msg.stored_blocks >= 0 and svc.admit_now(rec):
                return  # its hits known here: queued now, nothing to wait for
            self.admitting[rec.req_id] = (rec, [])
            svc.spawn(self._admit(rec), name=f"admit-{rec.req_id}")
            return
        if rec is None or msg.attempt <= rec.attempt or rec.finished:
            return  # finished meanwhile, or an attempt already seen
        svc.reads.done(rec.req_id)
        svc.dispatcher.remove(rec.req_id)
        svc.view.suspect([rec.pe, rec.de], now)  # the failed attempt's engines: not again before they speak
        rec.tokens, rec.next_index, rec.attempt = list(msg.streamed), len(msg.streamed), msg.attempt - 1
        remaining = rec.restart()
        rec.block_keys = KeyRun(msg.block_keys)
        svc.m.resumes.inc()
        svc.move(rec, ReqState.RESUMING, "resumed by its front-door worker")
        svc.spawn(svc._requeue(rec, remaining), name=f"resume-{rec.req_id}")

    async def _admit(self, rec: InFlight) -> None:
        """Its hit lookup and queueing in a task of its own; messages that came for it meanwhile follow."""
        try:
            await self.svc.admit(rec)
        finally:
            _, held = self.admitting.pop(rec.req_id)
        for msg in held:
            if self.svc.inflight.get(rec.req_id) is rec:
                self._apply(rec, msg)
