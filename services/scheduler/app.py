"""Scheduler wiring: the HTTP front door, the bus, the mesh view, dispatch and liveness.

Owns every accepted request until its last event reaches the client; the policy is `dispatch`'s.
With `front_workers` > 0 it is the dispatch core only (doors.py, worker.py)."""
from __future__ import annotations

import asyncio
import logging
import os
import time

from opentelemetry import trace

from services.scheduler.config import SchedulerConfig
from services.scheduler.hits import asker, known_hits, lookup_hits
from services.scheduler.inflight import InFlight
from services.scheduler.doors import FrontDoors, strand_event
from services.scheduler.events import OutputRouter
from services.scheduler.journal import Journal, JournalUnavailable, recover
from services.scheduler.lifecycle import IllegalTransition, Lifecycle, ReqState
from services.scheduler.liveness import Watch, stranded, unassigned_past
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.oracle import OracleIndex
from services.scheduler.placement import Lines, place, send
from services.scheduler.prefetcher import Prefetcher
from services.scheduler.view import MeshView
from shared.bus import Delivery
from shared.engine.store_layout import prompt_keys
from shared.http import HttpServer, adopt_socket, bind_socket
from shared.messages.codes import ErrorCode, FinishReason, LoadMode
from shared.messages.endpoints import EP
from shared.messages.journal import Accepted
from shared.messages.registry import SchedulerAnnounce
from shared.messages.stream import Output, TokenEvent
from shared.messages.traffic_manager import NodeReadDone
from shared.messages.work import Cancel
from shared.runtime import Service, service_main
from shared.sched.dispatch import Dispatcher, Job
from shared.sched.policy import PeThresholds
from shared.sched.reads import PendingReads

log = logging.getLogger("scheduler")
tracer = trace.get_tracer("scheduler")


class SchedulerService(Service):
    name = "scheduler"

    def __init__(self, cfg: SchedulerConfig):
        super().__init__(cfg)
        from shared.model.tokenizer_build import load_tokenizer

        self.tokenizer = None if cfg.front_workers else load_tokenizer(cfg.model)  # the workers tokenize
        self.view = MeshView(timeout_s=cfg.liveness_timeout_s)
        self.dispatcher = Dispatcher(PeThresholds(alpha=cfg.pe_alpha_tokens, beta=cfg.pe_beta_tokens))
        self.inflight: dict[str, InFlight] = {}
        self.life = Lifecycle()  # each request's state: the one writer of InFlight.state
        self.kick = asyncio.Event()
        self.reads = PendingReads(near_tie=cfg.read_near_tie)
        self.lines = Lines()  # the dispatcher's engine lines, kept between rounds
        self.oracle = OracleIndex()
        self.http: HttpServer | None = None
        self.http_sock = adopt_socket(cfg.http_fd) if cfg.http_fd >= 0 else \
            bind_socket(cfg.http_host, cfg.http_port, "http_port")  # before NATS: a taken port fails at once
        self.journal: Journal | None = None
        self.prefetcher: Prefetcher | None = None  # agent sessions: retention, prefetch, release (start())
        self.doors = FrontDoors(self) if cfg.front_workers else None  # the front-door worker processes
        self.watch = Watch(cfg.liveness_timeout_s)  # judges silences against the scheduler's own stalls
        self.m = SchedulerMetrics.register(self.metrics)
        self.router = OutputRouter(self.inflight, lambda rec, ev, source: self.resume(rec, ev.error),
                                   self._prefill_over, self.m.loop_errors.labels("output").inc)
        self.metrics_endpoint = self.metrics.endpoint
        self.max_context = self.view.max_context  # (front.Front)

    @property
    def output_subject(self) -> str:
        return self.subjects.at(EP.SCHED_OUT, scheduler=self.instance)

    async def start(self) -> None:
        from services.scheduler.api import build_app
        self.bus.losses.on_reconnect.append(self._reconnected)
        await self.bus.subscribe(self.subjects.at(EP.HEARTBEAT), self._on_announce)
        await self.bus.subscribe(self.output_subject, self._on_output)
        await self.bus.subscribe(self.subjects.at(EP.READS_DONE), self._on_reads_done)
        if self.cfg.journal:
            journal = Journal(self.bus.nc, self.cfg.namespace)
            try:
                await journal.ensure()
                self.journal = journal
                self.spawn(journal.run(), name="journal")
                self.spawn(self._recover(), name="journal-recover")
            except JournalUnavailable as exc:
                log.warning("%s; running without a request journal", exc)
        self._ask_hits = asker(self.bus, self.subjects)  # one HitQuery to any storage-gateway
        self.prefetcher = Prefetcher(self.bus, self.subjects, self.view, self.reads, self.cfg, self.spawn,
                                     self._ask_hits, self.metrics)
        self.spawn(self.prefetcher.sweep(), name="prefetch-sweep")
        self.end_session = self.prefetcher.close_session  # (front.Front: POST /close_session)
        if self.doors is not None:
            await self.doors.start()
        else:
            self.http = HttpServer(build_app(self), sock=self.http_sock)
            self.spawn(self.http.serve(), name="api-http")
        self.spawn(self._loop("dispatch", self._kicked, self._assign), name="dispatch")
        self.spawn(self._loop("liveness", lambda: asyncio.sleep(min(0.5, self.cfg.liveness_timeout_s / 3)),
                              self._check_liveness), name="liveness")
        log.info("serving on %s (front-door workers: %d)", self.http_url, self.cfg.front_workers)

    @property
    def http_url(self) -> str:
        return "http://{}:{}".format(*self.http_sock.getsockname()[:2])

    def announce(self) -> SchedulerAnnounce:
        return SchedulerAnnounce(instance=self.instance, node=self.cfg.node, metrics_url=self.metrics_url,
                                 pid=os.getpid(), http_url=self.http_url, queued=self.dispatcher.waiting())

    async def stop(self) -> None:
        for rec in list(self.inflight.values()):
            rec.fail(ErrorCode.SHUTTING_DOWN, "scheduler shutting down")
        if self.http:
            self.http.stop()
        if self.doors is not None:
            await self.doors.stop()

    # what the front door sees (`front.Front`) --------------------------------------
    def model_id(self) -> str:
        return self.cfg.served_model_name or next(iter(self.view.model_ids()), "")

    def accepts_model(self, name: str | None) -> bool:
        return name is None or name == self.model_id() or name in self.view.model_ids()

    async def health(self) -> tuple[bool, dict]:
        ok, body = self.view.health(time.monotonic(), queued=self.life.waiting(), running=self.life.running())
        return ok, body | {"states": self.life.live()}

    async def mesh(self) -> dict:  # (a front-door worker adds the vocabulary's size)
        body = {**self.view.snapshot(time.monotonic(), self.cfg.mode), "model": self.model_id()}
        return body | ({"vocab_size": self.tokenizer.vocab_size} if self.tokenizer else {})

    async def admit(self, rec: InFlight) -> None:
        await self.lookup_hits(rec)
        self.prefetcher.arrive(rec)  # its prefix prefetched during a tool call: claimed for it
        self.submit(rec)

    def admit_now(self, rec: InFlight) -> bool:
        """Queue `rec` now if its hits need no gateway round trip; False: `admit` it."""
        if ok := known_hits(rec, self.view.store_layout(), self.oracle, *self.prefetcher.sources(rec.mode)):
            self.prefetcher.arrive(rec)
            self.submit(rec)
        return ok

    # requests ---------------------------------------------------------------------
    async def lookup_hits(self, rec: InFlight) -> None:
        await lookup_hits(rec, self.view.store_layout(), self.oracle, self._ask_hits, *self.prefetcher.sources(rec.mode))

    def submit(self, rec: InFlight) -> None:
        self.inflight[rec.req_id] = rec
        self.life.enter(rec)
        if self.journal:
            self.journal.note_accepted(Accepted(rec.req_id, time.time(), rec.prompt_len, rec.sampling, self.instance))
        self.dispatcher.enqueue(Job(rec.req_id, rec.prompt_len, rec.sampling.max_tokens))
        self.m.prompt.inc(rec.prompt_len)
        self.m.queue.set(self.dispatcher.waiting())
        self.kick.set()

    def cancel(self, rec: InFlight, reason: str) -> None:
        """Free the request everywhere, from a task of the service's (the caller may be cancelled)."""
        self.dispatcher.remove(rec.req_id)
        if not rec.finished:
            rec.finished = FinishReason.CANCELLED
        self.spawn_while_serving(self._cancel(rec.wire_id, reason), name=f"cancel-{rec.req_id}")

    def resume(self, rec: InFlight, why: str) -> bool:
        if rec.finished or rec.attempt >= self.cfg.max_resumes:
            return False
        self.spawn(self._cancel(rec.wire_id, "resumed elsewhere"))
        self.view.suspect([rec.pe, rec.de], time.monotonic())  # not placed there again before they speak
        self.reads.done(rec.req_id)
        self.dispatcher.remove(rec.req_id)
        remaining = rec.restart()
        trace.get_current_span().add_event("resume", {"req_id": rec.req_id, "why": why, "attempt": rec.attempt})
        log.warning("resuming %s (attempt %d, %d tokens streamed): %s", rec.req_id, rec.attempt, rec.step0, why)
        self.m.resumes.inc()
        self.move(rec, ReqState.RESUMING, why)
        if remaining <= 0:
            rec.events.put_nowait(TokenEvent(rec.req_id, [], rec.next_index, finish=FinishReason.LENGTH))
            rec.finished = FinishReason.LENGTH
            return True
        self.spawn(self._requeue(rec, remaining), name=f"resume-{rec.req_id}")
        return True

    async def _requeue(self, rec: InFlight, remaining: int) -> None:
        with tracer.start_as_current_span("resume", context=rec.ctx, attributes={
                "req_id": rec.req_id, "attempt": rec.attempt, "tokens_streamed": rec.step0}):
            await self.lookup_hits(rec)
        if rec.req_id in self.inflight and not rec.finished:
            self.move(rec, ReqState.QUEUED, "resumed")
            self.dispatcher.enqueue(Job(rec.req_id, rec.work_len, remaining))
            self.kick.set()

    def move(self, rec: InFlight, dst: ReqState, why: str = "") -> bool:
        try:
            self.life.move(rec, dst, why)
        except IllegalTransition as exc:
            log.error("%s (%s)", exc, why)
            self.m.illegal.inc()
            return False
        self.m.running.set(self.life.running())
        return True

    def finish(self, rec: InFlight, status: str) -> None:
        if self.inflight.pop(rec.req_id, None) is None:
            return
        try:
            self.life.end(rec, status)
        except IllegalTransition as exc:
            log.error("%s", exc)
            self.m.illegal.inc()
        if self.journal:
            self.journal.note_finished(rec.req_id, status, rec.next_index)
        self.reads.done(rec.req_id)
        self.dispatcher.remove(rec.req_id)
        self.prefetcher.done(rec, status)
        if rec.mode == LoadMode.ORACLE and status == "ok" and rec.tokens and (layout := self.view.store_layout()):
            self.oracle.add(prompt_keys(layout, rec.prompt + rec.tokens[:-1]))  # what decode would have persisted
        self.m.finished(rec, status)
        self.m.running.set(self.life.running())
        self.m.queue.set(self.life.waiting())
        self.kick.set()

    async def _recover(self) -> None:
        """Cancel and count failed what an earlier life of this scheduler left unanswered."""
        self.m.requests.labels("error").inc(await recover(self.journal, lambda: set(self.view.schedulers), self._cancel,
                                                          self.cfg.max_resumes + 1, self.cfg.liveness_timeout_s))

    async def _cancel(self, wire_id: str, reason: str) -> None:
        await self.bus.publish(self.subjects.at(EP.CANCEL), Cancel(wire_id, reason))

    # bus handlers -------------------------------------------------------------------
    async def _on_announce(self, msg, d: Delivery) -> None:
        if not isinstance(msg, SchedulerAnnounce):
            self.watch.heard(time.monotonic())
        if self.view.update(msg, time.monotonic()) and self.dispatcher.waiting():  # a change, while work waits
            self.kick.set()
        if self.view.restarted:  # its old process's requests are lost with it: now, not at a timeout
            engines = self.view.take_restarted()
            log.warning("engines %s came back as new processes; resuming their requests", engines)
            self._strand(engines, "restarted")

    async def _on_output(self, msg: Output, d: Delivery) -> None:
        self.router.route(msg)

    async def _on_reads_done(self, msg: NodeReadDone, d: Delivery) -> None:
        """A node's reads for a request are over: its read_q drops them."""
        rec = self.inflight.get(msg.req_id.partition("#")[0])
        if rec is not None and msg.req_id == rec.wire_id:  # not an old attempt's
            self.reads.read_done(rec.req_id, msg.node)
            self.kick.set()

    def _prefill_over(self, rec: InFlight, source: str = "") -> None:
        """An attempt's first token: its reads are done, its PE is free."""
        if rec.state == ReqState.PREFILLING:
            self.move(rec, ReqState.DECODING, f"first token from {source}" if source else "first token")
        self.reads.done(rec.req_id)
        self.dispatcher.prefill_done(rec.req_id)
        self.kick.set()

    # loops ----------------------------------------------------------------------------
    async def _loop(self, label: str, wait, step) -> None:
        while True:  # a failed step is logged and counted, never fatal
            await wait()
            try:
                await step()
            except Exception:  # noqa: BLE001 - a bad request must never stop dispatching or liveness
                log.exception("%s failed; continuing", label)
                self.m.loop_errors.labels(label).inc()

    async def _kicked(self) -> None:
        await self.kick.wait()
        await asyncio.sleep(0)  # kicks already on their way (a burst of heartbeats, submits) share this round
        self.kick.clear()

    async def _assign(self) -> None:
        """One dispatch round, none while nothing waits."""
        if not self.dispatcher.waiting():  # a freed engine, a finished request: nothing to place
            return self.m.running.set(self.life.running())
        self.m.rounds.inc()
        now = time.monotonic()
        pes, des = self.lines.get(self.view, self.dispatcher.ledger, self.reads, now)
        self.m.set_engines(len(pes), len(des))
        for a in self.dispatcher.assign(pes, des, self.lines.changed):
            rec = self.inflight.get(a.req_id)
            if rec is None:
                self.dispatcher.remove(a.req_id)
                continue
            rec.pe, rec.de, rec.assigned_at = a.pe, a.de, time.monotonic()
            self.move(rec, ReqState.PREFILLING, f"{a.pe} -> {a.de}")
            self.m.assign_wait.observe(rec.assigned_at - rec.queued_at)
            placed = place(rec, a.pe, a.de, self.view, self.reads, rec.reply or self.output_subject, self.cfg.read_path)
            await send(self.bus, rec, a.pe, placed, self.subjects)
        self.m.queue.set(self.life.waiting())
        self.m.running.set(self.life.running())

    def _strand(self, engines: list[str], what: str) -> None:
        for rec, engine in stranded(list(self.inflight.values()), engines):
            self._attempt_lost(rec, engine, f"engine {engine} {what}")

    def _attempt_lost(self, rec: InFlight, engine: str, why: str) -> None:
        """`rec`'s attempt cannot go on: its worker resumes it, or this process does, or fails it."""
        if rec.reply:
            rec.events.put_nowait(strand_event(rec, engine, why))
        elif not self.resume(rec, why):
            rec.fail(ErrorCode.ENGINE_FAILED, why)
            self.spawn(self._cancel(rec.wire_id, why))

    def _reconnected(self) -> None:
        """Back on NATS: events sent meanwhile may be lost, so every placed request of this process resumes."""
        for rec in list(self.inflight.values()):
            if not rec.reply and rec.state in (ReqState.PREFILLING, ReqState.DECODING):
                self._attempt_lost(rec, "", "the connection to NATS was lost")

    def _stalled(self, now: float) -> None:
        """Placed requests that heard nothing from their engines for `stall_timeout_s`: resumed."""
        limit = self.cfg.stall_timeout_s
        for rec in list(self.inflight.values()) if limit > 0 else ():
            if rec.state in (ReqState.PREFILLING, ReqState.DECODING) and \
                    now - max(rec.last_at, rec.assigned_at) > limit:
                self._attempt_lost(rec, rec.de or rec.pe, f"no event from its engines for {limit:g} s")

    async def _check_liveness(self) -> None:
        """Resume (or fail) the requests of engines that went silent; expire unassigned requests."""
        now = time.monotonic()
        dead = list(self.watch.judge(now, self.view.silences(now), len(self.view.engines)))
        for engine in dead:
            log.warning("engine %s stopped heartbeating; resuming its requests elsewhere", engine)
            self.view.forget(engine)
        self._strand(dead, "stopped responding")
        self._stalled(now)
        for rec in unassigned_past(list(self.inflight.values()), now, self.cfg.assign_timeout_s):
            self.dispatcher.remove(rec.req_id)
            rec.fail(ErrorCode.NO_ENGINE, "no engine available to serve the request")
            self.spawn(self._cancel(rec.wire_id, "not assigned in time"))
        self.kick.set()


def main(argv: list[str] | None = None) -> int:
    return service_main("scheduler", SchedulerConfig, SchedulerService, argv)
