"""Scheduler wiring: the HTTP front door, the bus, the mesh view, dispatch and liveness.

Owns the lifecycle of every accepted request until its last event reaches the client.
Policy lives in `dispatch` (and `policy/`); protocol in `protocol`; HTTP handlers in `api`.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time

import msgspec

from opentelemetry import trace

from services.scheduler.config import SchedulerConfig
from services.scheduler.dispatch import Dispatcher, EngineLoad, Job
from services.scheduler.policy import PeThresholds
from services.scheduler.inflight import InFlight
from services.scheduler.journal import Accepted, Journal, JournalError, JournalUnavailable
from services.scheduler.paths import OracleIndex, ReadQueues
from services.scheduler.view import MeshView
from shared.bus import BusError, Delivery
from shared.http import HttpServer, adopt_socket, bind_socket
from shared.engine.store_layout import prompt_keys
from shared.messages.registry import Announce, SchedulerAnnounce
from shared.messages.storage import HitQuery, HitReply
from shared.messages.stream import Output, TokenEvent
from shared.messages.work import Cancel, PrefillWork
from shared.runtime import Service, service_main

log = logging.getLogger("scheduler")
tracer = trace.get_tracer("scheduler")


class SchedulerService(Service):
    name = "scheduler"

    def __init__(self, cfg: SchedulerConfig):
        super().__init__(cfg)
        from shared.model.tokenizer import load_tokenizer

        self.tokenizer = load_tokenizer(cfg.model)
        self.view = MeshView(timeout_s=cfg.liveness_timeout_s)
        self.dispatcher = Dispatcher(PeThresholds(alpha=cfg.pe_alpha_tokens, beta=cfg.pe_beta_tokens))
        self.inflight: dict[str, InFlight] = {}
        self.kick = asyncio.Event()
        self.reads = ReadQueues()
        self.oracle = OracleIndex()
        self.http: HttpServer | None = None
        self.http_sock = adopt_socket(cfg.http_fd) if cfg.http_fd >= 0 else \
            bind_socket(cfg.http_host, cfg.http_port, "http_port")  # before NATS: a taken port fails at once
        self.journal: Journal | None = None
        m = self.metrics
        self.m_requests = m.counter("requests_total", "Requests answered", ("status",))
        self.m_prompt = m.counter("prompt_tokens_total", "Prompt tokens accepted")
        self.m_gen = m.counter("generation_tokens_total", "Tokens generated")
        self.m_cached = m.counter("cached_prompt_tokens_total", "Prompt tokens served from the store")
        self.m_ttft = m.histogram("time_to_first_token_seconds", "TTFT")
        self.m_tpot = m.histogram("time_per_output_token_seconds", "TPOT",
                                  buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2))
        self.m_queue = m.gauge("queue_length", "Requests waiting for an engine")
        self.m_running = m.gauge("requests_running", "Requests assigned and not finished")
        self.m_engines = m.gauge("engines_live", "Assignable engines", ("role",))
        self.m_loop_errors = m.counter("loop_errors_total", "Exceptions caught in the scheduler's loops", ("loop",))
        self.m_resumes = m.counter("request_resumes_total", "Requests resumed on other engines after a failure")

    @property
    def output_subject(self) -> str:
        return self.subjects.output(self.instance)

    async def start(self) -> None:
        from services.scheduler.api import build_app

        await self.bus.subscribe(self.subjects.heartbeat, Announce, self._on_announce)
        await self.bus.subscribe(self.output_subject, Output, self._on_output)
        if self.cfg.journal:
            journal = Journal(self.bus.nc, self.cfg.namespace)
            try:
                await journal.ensure()
                self.journal = journal
                self.spawn(journal.run(), name="journal")
                self.spawn(self._recover(), name="journal-recover")
            except JournalUnavailable as exc:
                log.warning("%s; running without a request journal", exc)
        self.http = HttpServer(build_app(self), sock=self.http_sock)
        self.spawn(self.http.serve(), name="api-http")
        self.spawn(self._dispatch_loop(), name="dispatch")
        self.spawn(self._liveness_loop(), name="liveness")
        log.info("serving on %s", self.http.url)

    def announce(self) -> SchedulerAnnounce:
        return SchedulerAnnounce(instance=self.instance, node=self.cfg.node, metrics_url=self.metrics_url,
                                 pid=os.getpid(), http_url=self.http.url if self.http else "",
                                 queued=len(self.dispatcher.queue))

    async def stop(self) -> None:
        for rec in list(self.inflight.values()):
            rec.fail("scheduler shutting down")
        if self.http:
            self.http.stop()

    # model identity ---------------------------------------------------------------
    def model_id(self) -> str:
        if self.cfg.served_model_name:
            return self.cfg.served_model_name
        ids = self.view.model_ids()
        return ids[0] if ids else ""

    def accepts_model(self, name: str | None) -> bool:
        return name is None or name == self.model_id() or name in self.view.model_ids()

    # requests ---------------------------------------------------------------------
    async def lookup_hits(self, rec: InFlight) -> None:
        """Key the prompt's full blocks and ask a storage-gateway how many leading ones are stored."""
        layout = self.view.store_layout()
        if layout is None:
            return
        rec.block_keys = prompt_keys(layout, rec.work_prompt)
        if not rec.block_keys:
            return
        if rec.mode == "oracle":  # no store: the oracle's own index of what would be stored
            rec.hit_blocks = self.oracle.hits(rec.block_keys)
            return
        with tracer.start_as_current_span("hit_lookup", context=rec.ctx,
                                          attributes={"req_id": rec.req_id, "blocks": len(rec.block_keys)}) as span:
            try:
                reply = await self.bus.request(self.subjects.sg_any("hit"), HitQuery(layout, rec.block_keys),
                                               HitReply, timeout=2.0)
                rec.hit_blocks = reply.blocks
            except BusError as exc:
                span.set_attribute("error", exc.reason)  # no gateway: everything is a miss
            span.set_attribute("hit_blocks", rec.hit_blocks)

    def submit(self, rec: InFlight) -> None:
        self.inflight[rec.req_id] = rec
        if self.journal:
            self.journal.note_accepted(Accepted(rec.req_id, time.time(), len(rec.prompt), rec.sampling, self.instance))
        self.dispatcher.enqueue(Job(rec.req_id, len(rec.prompt), rec.sampling.max_tokens))
        self.m_prompt.inc(len(rec.prompt))
        self.m_queue.set(self.dispatcher.waiting())
        self.kick.set()

    async def cancel(self, rec: InFlight, reason: str) -> None:
        """The client left (or a stop string matched): free the request everywhere."""
        self.dispatcher.remove(rec.req_id)
        if not rec.finished:
            rec.finished = "cancelled"
        await self.bus.publish(self.subjects.cancel, Cancel(rec.wire_id, reason))

    def resume(self, rec: InFlight, why: str) -> bool:
        """Run the request again elsewhere, after the tokens already streamed (False: give up)."""
        if rec.finished or rec.attempt >= self.cfg.max_resumes:
            return False
        self.spawn(self.bus.publish(self.subjects.cancel, Cancel(rec.wire_id, "resumed elsewhere")))
        self.reads.done(rec.req_id)
        self.dispatcher.remove(rec.req_id)
        remaining = rec.restart()
        trace.get_current_span().add_event("resume", {"req_id": rec.req_id, "why": why, "attempt": rec.attempt})
        log.warning("resuming %s (attempt %d, %d tokens streamed): %s", rec.req_id, rec.attempt, rec.step0, why)
        self.m_resumes.inc()
        if remaining <= 0:
            rec.events.put_nowait(TokenEvent(rec.req_id, [], rec.next_index, finish="length"))
            rec.finished = "length"
            return True
        self.spawn(self._requeue(rec, remaining), name=f"resume-{rec.req_id}")
        return True

    async def _requeue(self, rec: InFlight, remaining: int) -> None:
        with tracer.start_as_current_span("resume", context=rec.ctx, attributes={
                "req_id": rec.req_id, "attempt": rec.attempt, "tokens_streamed": rec.step0}):
            await self.lookup_hits(rec)
        if rec.req_id in self.inflight and not rec.finished:
            self.dispatcher.enqueue(Job(rec.req_id, len(rec.work_prompt), remaining))
            self.kick.set()

    def finish(self, rec: InFlight, status: str) -> None:
        if self.inflight.pop(rec.req_id, None) is None:
            return
        if self.journal:
            self.journal.note_finished(rec.req_id, status, rec.next_index)
        self.reads.done(rec.req_id)
        if rec.mode == "oracle" and status == "ok" and rec.tokens:
            layout = self.view.store_layout()
            if layout is not None:  # what decode would have persisted: prompt + generated KV
                self.oracle.add(prompt_keys(layout, rec.prompt + rec.tokens[:-1]))
        self.m_requests.labels(status).inc()
        self.m_gen.inc(rec.next_index)
        self.m_cached.inc(rec.cached_tokens)
        if rec.first_at:
            self.m_ttft.observe(rec.ttft)
        if rec.next_index > 1:
            self.m_tpot.observe(rec.tpot)
        self.m_running.set(sum(1 for r in self.inflight.values() if r.pe))
        self.kick.set()

    async def _recover(self) -> None:
        """Requests an earlier life of this scheduler accepted and never answered: their clients are
        gone. Cancel every attempt on the engines (frees their KV) and count them failed."""
        await asyncio.sleep(self.cfg.liveness_timeout_s)  # hear live peer schedulers first: theirs are not ours
        live = set(self.view.schedulers)
        try:
            lost = [a for a in await self.journal.unfinished() if a.scheduler not in live]
        except JournalError as exc:
            log.warning("journal not read, nothing recovered: %s", exc)
            return
        for acc in lost:
            for attempt in range(self.cfg.max_resumes + 1):  # engines know wire ids: req_id#attempt
                await self.bus.publish(self.subjects.cancel, Cancel(f"{acc.req_id}#{attempt}", "scheduler restarted"))
            self.m_requests.labels("error").inc()
            self.journal.note_finished(acc.req_id, "error", 0)  # the next restart does not redo it
        if lost:
            log.warning("%d requests left unfinished by a previous scheduler: cancelled, counted failed", len(lost))

    # bus handlers -------------------------------------------------------------------
    async def _on_announce(self, msg, d: Delivery) -> None:
        self.view.update(msg, time.monotonic())
        self.kick.set()

    async def _on_output(self, msg: Output, d: Delivery) -> None:
        """Engine output: one TokenEvent (a first token, a failure) or a decode step's StepEvents,
        fanned out here to each request it names."""
        if isinstance(msg, TokenEvent):
            self._on_event(msg, msg.source)
            return
        for ev in msg.events:
            try:
                self._on_event(ev, msg.source)
            except Exception:  # noqa: BLE001 - one bad entry must not cost the step's other requests
                log.exception("output event for %s failed; dropped", ev.req_id)
                self.m_loop_errors.labels("output").inc()

    def _on_event(self, ev: TokenEvent, source: str) -> None:
        base, _, attempt = ev.req_id.partition("#")
        rec = self.inflight.get(base)
        if rec is None or attempt != str(rec.attempt):
            return  # an old attempt of a resumed request
        if ev.finish == "error" and ev.retryable and self.resume(rec, ev.error):
            return
        ev = msgspec.structs.replace(ev, req_id=base, index=ev.index + rec.step0, source=source)
        out = rec.accept(ev)
        if out is not None:
            if out.index == 0:
                self.reads.done(rec.req_id)  # prefill is over: its storage reads are done
            rec.events.put_nowait(out)

    # loops ----------------------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        while True:
            await self.kick.wait()
            self.kick.clear()
            try:
                await self._assign()
            except Exception:  # noqa: BLE001 - a bad request must never stop dispatching
                log.exception("dispatch failed; continuing")
                self.m_loop_errors.labels("dispatch").inc()

    def _loads(self, role: str, now: float) -> list[EngineLoad]:
        loads = []
        for eng in self.view.assignable(role, now):
            mine = [r for r in self.inflight.values() if (r.pe if role == "prefill" else r.de) == eng.engine]
            if role == "prefill":  # tok_e on the PE side: prompt tokens still to prefill
                held = [self.inflight[q] for q, pe in self.dispatcher.pe_of.items()
                        if pe == eng.engine and q in self.inflight]  # PE chosen, DE not yet
                mine = [r for r in mine if not r.first_at] + held
                tok = sum(len(r.prompt) for r in mine)
            else:
                tok = sum(len(r.prompt) + r.sampling.max_tokens for r in mine)
            loads.append(EngineLoad(eng.engine, tok=tok, seq=len(mine),
                                    capacity_tokens=eng.total_blocks * eng.kv.block_size,
                                    group=eng.group or eng.node, node=eng.node,
                                    read_q=self.reads.pending.get(eng.node, 0)))
        return loads

    async def _assign(self) -> None:
        now = time.monotonic()
        pes, des = self._loads("prefill", now), self._loads("decode", now)
        self.m_engines.labels("prefill").set(len(pes))
        self.m_engines.labels("decode").set(len(des))
        for a in self.dispatcher.assign(pes, des):
            rec = self.inflight.get(a.req_id)
            if rec is None:
                continue
            rec.pe, rec.de, rec.assigned_at = a.pe, a.de, time.monotonic()
            pe_node, de_node = self.view.node_of(a.pe), self.view.node_of(a.de)
            bs = self.view.store_layout().block_size if self.view.store_layout() else 64
            usable = min(rec.hit_blocks, (len(rec.work_prompt) - 1) // bs)
            path = self.reads.decide(rec.mode, usable if rec.mode != "oracle" else 0, pe_node, de_node, bs,
                                     force=self.cfg.read_path)
            self.reads.hold(rec.req_id, path, pe_node, de_node, bs)
            with tracer.start_as_current_span("assign", context=rec.ctx, attributes={
                    "req_id": rec.req_id, "pe": a.pe, "de": a.de, "mode": rec.mode,
                    "queue_wait_s": rec.assigned_at - rec.arrived, "hit_blocks": rec.hit_blocks,
                    "read_path": path.path, "pe_path_blocks": path.pe_blocks, "de_path_blocks": path.de_blocks,
                    "pe_read_queue_tokens": path.pe_queue, "de_read_queue_tokens": path.de_queue,
                    "read_path_reason": path.reason}):
                work = PrefillWork(rec.wire_id, rec.work_prompt, rec.work_sampling(), a.de, self.output_subject,
                                   block_keys=rec.block_keys, hit_blocks=rec.hit_blocks, read_node=pe_node,
                                   mode=rec.mode, pe_blocks=path.pe_blocks if path.de_blocks else -1,
                                   de_node=de_node)
                await self.bus.publish(self.subjects.prefill_work(a.pe), work)
        self.m_queue.set(self.dispatcher.waiting())
        self.m_running.set(sum(1 for r in self.inflight.values() if r.pe))

    async def _liveness_loop(self) -> None:
        while True:
            await asyncio.sleep(min(0.5, self.cfg.liveness_timeout_s / 3))
            try:
                self._check_liveness()
            except Exception:  # noqa: BLE001
                log.exception("liveness check failed; continuing")
                self.m_loop_errors.labels("liveness").inc()

    def _check_liveness(self) -> None:
        """Resume (or fail) the requests of engines that went silent; expire unassigned requests."""
        now = time.monotonic()
        for engine in self.view.dead_engines(now):
            log.warning("engine %s stopped heartbeating; resuming its requests elsewhere", engine)
            self.view.forget(engine)
            for rec in list(self.inflight.values()):
                if engine not in (rec.pe, rec.de) or rec.finished:
                    continue
                if engine == rec.pe and rec.de != engine and rec.next_index > rec.step0 + 1:
                    continue  # its decode engine already holds it: the prefill side is done
                why = f"engine {engine} stopped responding"
                if not self.resume(rec, why):
                    rec.fail(why)
                    self.spawn(self.bus.publish(self.subjects.cancel, Cancel(rec.wire_id, why)))
        for rec in list(self.inflight.values()):
            if not rec.pe and now - rec.queued_at > self.cfg.assign_timeout_s:
                self.dispatcher.remove(rec.req_id)
                rec.fail("no engine available to serve the request")
                self.spawn(self.bus.publish(self.subjects.cancel, Cancel(rec.wire_id, "not assigned in time")))
        self.kick.set()


def main(argv: list[str] | None = None) -> int:
    return service_main("scheduler", SchedulerConfig, SchedulerService, argv)
