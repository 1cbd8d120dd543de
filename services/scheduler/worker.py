"""A front-door worker of the scheduler service: HTTP in, tokenize, key, ask the store, stream tokens out.

The dispatch core spawns it; engines' tokens come to the worker's own subject, never the core, and
the prompt's ids stay here. It resumes its own requests."""
from __future__ import annotations

import argparse
import asyncio
import ctypes
import dataclasses
import json
import logging
import signal
import sys
import time

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from services.scheduler.config import SchedulerConfig
from services.scheduler.events import OutputRouter
from services.scheduler.hits import asker, stored_blocks
from services.scheduler.inflight import InFlight
from services.scheduler.protocol import ApiError, failure
from shared.bus import BusError, Delivery
from shared.engine.store_layout import prompt_keys
from shared.http import HttpServer, adopt_socket
from shared.messages.codes import ErrorCode, FinishReason, LoadMode
from shared.messages.endpoints import EP
from shared.messages.front import Answer, Ask, Done, Forward, FrontInfo, PrefillOver, Submit
from shared.messages.registry import SchedulerAnnounce
from shared.messages.stream import TokenEvent
from shared.messages.typed_subject import Subject
from shared.messages.work import Cancel
from shared.runtime import Service

log = logging.getLogger("scheduler.worker")


class FrontWorker(Service):
    name = "scheduler"

    def __init__(self, cfg: SchedulerConfig, core: str, index: int, fd: int):
        super().__init__(dataclasses.replace(cfg, instance=f"{core}-w{index}", metrics_port=0))
        from shared.model.tokenizer_build import load_tokenizer

        self.core = core
        self.tokenizer = load_tokenizer(cfg.model)
        self.sock = adopt_socket(fd)
        self.info = FrontInfo()
        self.inflight: dict[str, InFlight] = {}
        self.http: HttpServer | None = None
        self.reply = self.subjects.at(EP.SCHED_OUT, scheduler=self.instance)
        self.router = OutputRouter(self.inflight, self._retry, self._prefill_over)
        self.m_resumes = self.metrics.counter("front_resumes_total", "Requests this worker resumed elsewhere")

    async def start(self) -> None:
        from services.scheduler.api import build_app
        self._ask_hits = asker(self.bus, self.subjects)
        self.bus.losses.on_reconnect.append(self._reconnected)
        await self.bus.subscribe(self.reply, self._on_output)
        await self.bus.subscribe(self.subjects.at(EP.SCHED_INFO, scheduler=self.core), self._on_info)
        await self.bus.subscribe(self.subjects.at(EP.SCHED_FORWARD, scheduler=self.instance), self._on_work)
        try:
            await self._ask("info")
        except ApiError as exc:  # the core answers soon; its info also arrives every heartbeat
            log.warning("no info from the dispatch core yet: %s", exc)
        self.http = HttpServer(build_app(self), sock=self.sock)
        self.spawn(self.http.serve(), name="api-http")
        self.spawn(self._watch_bus(), name="watch-bus")

    @property
    def heartbeat_subject(self) -> Subject:
        """A worker heartbeats to its core, not into the mesh's registry."""
        return self.subjects.at(EP.SCHED_WORKERS, scheduler=self.core)

    def announce(self) -> SchedulerAnnounce:
        return SchedulerAnnounce(instance=self.instance, node=self.cfg.node, metrics_url=self.metrics_url,
                                 http_url=self.http.url if self.http else "", queued=len(self.inflight))

    async def stop(self) -> None:
        for rec in list(self.inflight.values()):
            rec.fail(ErrorCode.SHUTTING_DOWN, "scheduler shutting down")
        if self.http:
            self.http.stop()

    # what the handlers see (front.Front) --------------------------------------------------
    def model_id(self) -> str:
        return self.info.model_id

    def accepts_model(self, name: str | None) -> bool:
        return name is None or name == self.info.model_id or name in self.info.model_ids

    def max_context(self) -> int:
        return self.info.max_context

    async def health(self) -> tuple[bool, dict]:
        a = await self._ask("health")
        return a.status == 200, json.loads(a.body)

    async def mesh(self) -> dict:
        return {**json.loads((await self._ask("mesh")).body), "vocab_size": self.tokenizer.vocab_size}

    async def metrics_endpoint(self, request: Request) -> Response:
        a = await self._ask("metrics")
        return Response(a.body, status_code=a.status, media_type=a.content_type)

    async def end_session(self, session: str) -> None:
        await self._ask("close_session", session)  # the core holds the sessions' staging and retention

    async def _ask(self, what: str, session: str = "") -> Answer:
        """The dispatch core's answer; a 503 (ApiError) when none comes within ~3 s."""
        deadline = time.monotonic() + 3.0
        while True:
            try:
                if self.bus.nc.is_connected:
                    a = await self.bus.request(self.subjects.at(EP.SCHED_ASK, scheduler=self.core), Ask(what, session),
                                               timeout=max(0.1, deadline - time.monotonic()))
                    break
                why = "the bus is unreachable"
            except BusError as exc:
                why = exc.reason
            if time.monotonic() > deadline:
                raise ApiError(503, f"the scheduler's dispatch core did not answer: {why}",
                               kind="service_unavailable", code=ErrorCode.NO_ENGINE) from None
            await asyncio.sleep(0.1)
        if a.info is not None:
            self.info = a.info
        return a

    async def admit(self, rec: InFlight) -> None:
        if not self.bus.nc.is_connected:  # nothing could reach the core or an engine: no waiting for it
            raise failure(ErrorCode.NO_ENGINE, "no engine reachable: the scheduler is cut off from the bus")
        self.inflight[rec.req_id] = rec
        keys = rec.block_keys = self._keys(rec.prompt)  # kept here: filled into the work as the ids are (_on_work)
        # the core keys them, or needs them (a session's retention and prefetch, the oracle's index, a
        # finished turn's blocks held for the next: keyed from prompt + generated)
        ids = not keys or rec.hint is not None or rec.mode == LoadMode.ORACLE or self.cfg.serve_pending_saves
        # the store asked here, not by the core (its round trip off the dispatch core); a session's
        # (hinted) request is looked up by the core, which knows what was prefetched for it
        try:
            stored = -1 if ids else await stored_blocks(keys, self.info.layout, self._ask_hits, rec.ctx, rec.req_id)
        except asyncio.CancelledError:  # the handler went away before anything was submitted
            self.inflight.pop(rec.req_id, None)
            raise
        if rec.finished:  # failed meanwhile (shutting down): its events say so, nothing to submit
            return
        await self._submit(rec, Submit(rec.req_id, self.reply, rec.sampling, prompt=rec.prompt if ids else [],
                                       prompt_tokens=len(rec.prompt), block_keys=b"".join(keys), stored_blocks=stored,
                                       mode=rec.mode, hint=rec.hint, waited_s=time.monotonic() - rec.arrived))

    def cancel(self, rec: InFlight, reason: str) -> None:
        if not rec.finished:
            rec.finished = FinishReason.CANCELLED
        self.spawn_while_serving(self.bus.publish(self.subjects.at(EP.CANCEL), Cancel(rec.wire_id, reason)),
                                 name=f"cancel-{rec.req_id}")

    def finish(self, rec: InFlight, status: str) -> None:
        if self.inflight.pop(rec.req_id, None) is None:
            return
        done = Done(rec.req_id, status, rec.tokens, rec.cached_tokens, rec.ttft, rec.tpot, rec.tiers)
        self.spawn(self.bus.publish(self.subjects.at(EP.SCHED_FRONT, scheduler=self.core), done),
                   name=f"done-{rec.req_id}")

    async def _watch_bus(self) -> None:
        """Cut off from the bus past `liveness_timeout_s`: every request ends with an error now."""
        cut_since = None
        while True:
            await asyncio.sleep(min(0.5, self.cfg.liveness_timeout_s / 3))
            if self.bus.nc.is_connected:
                cut_since = None
                continue
            now = time.monotonic()
            cut_since = cut_since or now
            if now - cut_since > self.cfg.liveness_timeout_s:
                for rec in list(self.inflight.values()):
                    rec.fail(ErrorCode.ENGINE_FAILED, "the mesh stopped responding: the bus is unreachable")

    def _reconnected(self) -> None:
        """Back on NATS: events sent meanwhile may be lost; its requests resume."""
        for rec in list(self.inflight.values()):
            if rec.pe and not rec.finished and not self.resume(rec, "the connection to NATS was lost"):
                rec.fail(ErrorCode.ENGINE_FAILED, "the connection to NATS was lost")

    def _keys(self, tokens: list[int]) -> list[bytes]:
        layout = self.info.layout
        return prompt_keys(layout, tokens) if layout is not None else []  # none yet: the core keys them

    async def _submit(self, rec: InFlight, msg: Submit) -> None:
        # the core's spans join the request's
        await self.bus.publish(self.subjects.at(EP.SCHED_FRONT, scheduler=self.core), msg, ctx=rec.ctx)

    # engine (and core) output ---------------------------------------------------------------
    async def _on_info(self, msg: FrontInfo, d: Delivery) -> None:
        self.info = msg

    async def _on_work(self, msg: Forward, d: Delivery) -> None:
        rec = self.inflight.get(msg.work.req_id.partition("#")[0])
        if rec is None or rec.finished or msg.work.req_id != rec.wire_id:
            return  # answered meanwhile (its Done frees the engines at the core), or an old attempt's
        rec.pe = rec.pe or msg.pe  # placed: a lost connection from now on resumes it
        work = msgspec.structs.replace(msg.work, prompt=rec.work_prompt, block_keys=rec.block_keys)
        # under the core's assign span
        await self.bus.publish(self.subjects.at(EP.PE_WORK, engine=msg.pe), work, ctx=d.ctx)

    async def _on_output(self, msg, d: Delivery) -> None:
        self.router.route(msg)

    def _retry(self, rec: InFlight, ev: TokenEvent, source: str) -> bool:
        """A retryable failure: resume the request (True: nothing for the client)."""
        if ev.code == ErrorCode.ENGINE_FAILED and running_without(rec, source):
            return True  # its prefill engine went silent after the decode engine took over
        return self.resume(rec, ev.error)

    def _prefill_over(self, rec: InFlight, source: str) -> None:
        rec.pe = source
        self.spawn(self.bus.publish(self.subjects.at(EP.SCHED_FRONT, scheduler=self.core),
                                    PrefillOver(rec.req_id, rec.attempt)),
                   name=f"first-{rec.req_id}")

    def resume(self, rec: InFlight, why: str) -> bool:
        if rec.finished or rec.attempt >= self.cfg.max_resumes:
            return False
        self.spawn(self.bus.publish(self.subjects.at(EP.CANCEL), Cancel(rec.wire_id, "resumed elsewhere")))
        remaining = rec.restart()
        log.warning("resuming %s (attempt %d, %d tokens streamed): %s", rec.req_id, rec.attempt, rec.step0, why)
        self.m_resumes.inc()
        if remaining <= 0:
            rec.events.put_nowait(TokenEvent(rec.req_id, [], rec.next_index, finish=FinishReason.LENGTH))
            rec.finished = FinishReason.LENGTH
            return True
        streamed = rec.tokens[: rec.step0]
        rec.block_keys = self._keys(rec.prompt + streamed)
        msg = Submit(rec.req_id, self.reply, rec.sampling, attempt=rec.attempt, streamed=streamed,
                     block_keys=b"".join(rec.block_keys), mode=rec.mode)
        self.spawn(self._submit(rec, msg), name=f"resume-{rec.req_id}")
        return True


def running_without(rec: InFlight, engine: str) -> bool:
    """`engine` was the attempt's PE and its DE already streams tokens: the request goes on."""
    return bool(engine) and engine == rec.pe and rec.de not in ("", engine) and rec.next_index > rec.step0 + 1


def _die_with_parent() -> None:
    """SIGTERM when the dispatch core that spawned this worker dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    from shared.logs import setup_logging
    from shared.runtime import StartFailed, Stopped, _install_stop_signals, run_service
    from shared.tracing import setup_tracing

    p = argparse.ArgumentParser(prog="python -m services.scheduler.worker")
    p.add_argument("--core", required=True, help="the dispatch core's instance")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--fd", type=int, required=True, help="the inherited listening socket")
    args = p.parse_args(argv)
    _die_with_parent()
    _install_stop_signals()
    cfg = msgspec.json.decode(sys.stdin.buffer.read(), type=SchedulerConfig)
    setup_logging("scheduler", cfg.log_level)
    try:
        svc = FrontWorker(cfg, args.core, args.index, args.fd)
        setup_tracing("scheduler", svc.instance)
        import uvloop

        uvloop.run(run_service(svc))
    except (Stopped, KeyboardInterrupt):
        return 0
    except StartFailed as exc:
        print(f"scheduler worker {args.index}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
