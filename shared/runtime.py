"""The common life of a service process: config -> uvloop -> lifespan -> signals -> drain.

On any exit short of SIGKILL the shm segments the process created are unlinked.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import os
import signal
import sys
import uuid
from abc import ABC, abstractmethod
from typing import Any, Awaitable, Callable, Coroutine, TypeVar

from prometheus_client.core import CounterMetricFamily
from starlette.applications import Starlette
from starlette.routing import Route

from shared import gcpace
from shared.beats import Beats
from shared.bus import Bus, BusUnavailable
from shared.config import ConfigError, load_config
from shared.http import HttpServer, PortInUse
from shared.logs import setup_logging
from shared.messages.endpoints import EP
from shared.messages.registry import Announce
from shared.messages.subjects import Subjects
from shared.messages.typed_subject import Subject
from shared.metrics import Metrics
from shared.priority import add_niceness
from shared.service_config import CommonConfig, check_common, config_parser, nats_options
from shared.tracing import setup_tracing, shutdown_tracing
from shared.transport.shm_region import reap_orphans, unlink_own

log = logging.getLogger("runtime")
T = TypeVar("T")
OnError = Callable[[Exception], Any]  # a failed task's answer: may return an awaitable


class Service(ABC):
    """One service's logic wired to the runtime. Subclasses live in services/<name>/app.py."""

    name: str = "service"

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.instance = cfg.instance or f"{self.name}-{uuid.uuid4().hex[:8]}"
        self.subjects = Subjects(cfg.namespace)
        self.metrics = Metrics(self.name)
        self.bus: Bus | None = None
        self.tasks: asyncio.TaskGroup | None = None
        self.metrics_url = ""
        self.owned: set[asyncio.Task] = set()  # cancelled at shutdown
        self.m_task_failures = self.metrics.counter(
            "task_failures_total", "Background tasks that raised (logged with traceback; the service goes on)",
            ("task",), shared=True)

    @property
    def heartbeat_subject(self) -> Subject:
        return self.subjects.at(EP.HEARTBEAT)

    @abstractmethod
    async def start(self) -> None:
        """Subscribe and start owned tasks (in self.tasks). Called once, after connect."""

    @abstractmethod
    def announce(self) -> Announce:
        """The current announcement (sent at start and every heartbeat)."""

    def beat_key(self, msg: Announce) -> object:
        """What of an announcement counts as a change (`Beats`); default: all of it."""
        return msg

    async def stop(self) -> None:
        """Stop intake and release resources; tasks are cancelled afterwards."""

    def routes(self) -> list[Route]:
        return []

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None, *, label: str = "",
              on_error: OnError | None = None) -> asyncio.Task:
        """Run `coro` as an owned task; an exception escaping it is logged, counted under `label`
        (default: the function's name; never per request) and handed to `on_error`, never the TaskGroup."""
        assert self.tasks is not None, "spawn() before start"
        label = label or task_label(coro)
        task = self.tasks.create_task(self._supervise(coro, name or label, label, on_error), name=name)
        self.owned.add(task)
        task.add_done_callback(self.owned.discard)
        task.add_done_callback(lambda _: coro.close())  # cancelled before it ran: `coro` never started
        return task

    def spawn_while_serving(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task | None:
        """`spawn`, or nothing once the service has stopped."""
        try:
            return self.spawn(coro, name)
        except RuntimeError:  # the TaskGroup is finished
            coro.close()
            return None

    async def _supervise(self, coro: Coroutine[Any, Any, Any], name: str, label: str,
                         on_error: OnError | None) -> None:
        try:
            await coro
        except Exception as exc:  # noqa: BLE001 - supervised: counted, logged, answered; the service goes on
            self.m_task_failures.labels(label).inc()
            log.exception("%s: task %s failed", self.instance, name, extra={"fields": {"task": label}})
            if on_error is not None:
                await _answer(on_error, exc, name)


def task_label(coro: object) -> str:
    """A task's metric label: its coroutine function's name, `_fetch_deadline` -> `fetch-deadline`."""
    name = getattr(coro, "__name__", "") or type(coro).__name__
    return name.strip("_").replace("_", "-") or "task"


async def _answer(on_error: OnError, exc: Exception, name: str) -> None:
    """Call a failed task's `on_error`; what it raises in turn is logged, never propagated."""
    try:
        res = on_error(exc)
        if inspect.isawaitable(res):
            await res
    except Exception:  # noqa: BLE001 - the answer to a failure must not become a second one
        log.exception("on_error of task %s failed", name)


class BusCounters:
    """Reads the bus's drop counters at scrape time (the bus stays metrics-free)."""

    def __init__(self, bus: Bus):
        self.bus = bus

    def collect(self):
        yield CounterMetricFamily("dualpath_bus_bad_messages", "Bus messages dropped: did not decode",
                                  value=self.bus.bad_messages)
        yield CounterMetricFamily("dualpath_bus_handler_errors", "Bus handlers that raised (message dropped)",
                                  value=self.bus.handler_errors)


async def _heartbeat(svc: Service, stop: asyncio.Event) -> None:
    beats = Beats(svc.cfg.quiet_beats)
    while not stop.is_set():
        try:
            msg = svc.announce()
            if beats.due(svc.beat_key(msg)):
                await svc.bus.publish(svc.heartbeat_subject, msg)
        except Exception as exc:  # noqa: BLE001 - reconnecting bus; keep beating
            beats.last = None  # the next beat goes out whatever it holds
            log.warning("heartbeat failed: %s", exc)
        try:
            await asyncio.wait_for(stop.wait(), svc.cfg.heartbeat_s)
        except asyncio.TimeoutError:
            pass


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGINT before the event loop took the signals over."""


class StartFailed(RuntimeError):
    def __init__(self, service: str, cause: BaseException):
        super().__init__(f"{service} failed to start: {type(cause).__name__}: {cause}")
        self.service, self.cause = service, cause


async def _unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> tuple[bool, T | None]:
    """(True, `work`'s result), or (False, None) when `stop` is set first (`work` is cancelled)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return False, None
    return True, task.result()


def _take_signals(stop: asyncio.Event) -> None:
    """From now on SIGTERM/SIGINT set `stop`; a second one exits at once."""
    loop = asyncio.get_running_loop()

    def on_signal(sig: int) -> None:
        if stop.is_set():
            log.warning("second %s while stopping: exiting now", signal.Signals(sig).name)
            unlink_own()
            os._exit(1)
        log.info("%s: stopping", signal.Signals(sig).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (NotImplementedError, RuntimeError):
            pass


async def run_service(svc: Service, stop: asyncio.Event | None = None) -> None:
    """Raises PortInUse, BusUnavailable or StartFailed when it cannot start; resources of a
    half-started service are released first."""
    stop = stop or asyncio.Event()
    _take_signals(stop)
    cfg = svc.cfg
    routes = [Route("/metrics", svc.metrics.endpoint)] + svc.routes()
    http = HttpServer(Starlette(routes=routes), cfg.host, cfg.metrics_port, setting="metrics_port")
    svc.metrics_url = http.url + "/metrics"
    try:
        connected, svc.bus = await _unless_stopped(
            Bus.connect(cfg.nats_url, svc.instance, wait_s=cfg.nats_wait_s, **nats_options(cfg)), stop)
    except BaseException:
        http.close()
        await asyncio.shield(_release(svc))
        raise
    if not connected:
        http.close()
        await asyncio.shield(_release(svc))
        log.info("%s stopped while waiting for NATS", svc.instance)
        return
    svc.metrics.registry.register(BusCounters(svc.bus))
    failure: BaseException | None = None
    try:
        async with asyncio.TaskGroup() as tg:
            svc.tasks = tg
            tg.create_task(http.serve(), name="metrics-http")
            try:
                started, _ = await _unless_stopped(svc.start(), stop)
            except Exception as exc:  # noqa: BLE001 - reported as StartFailed once everything is released
                started, failure = False, exc
            if started:
                gc.collect()
                gc.freeze()  # what start-up made (modules, the model) is never scanned by a collection again
                svc.spawn(gcpace.pace(), name="gc-pace")  # short young collections, never one long one
                svc.spawn(_heartbeat(svc, stop), name="heartbeat")
                log.info("%s started", svc.instance, extra={"fields": {"metrics": svc.metrics_url}})
                await stop.wait()
            await asyncio.shield(_leave(svc))
            http.stop()
            for task in list(svc.owned):
                task.cancel()
    finally:
        await asyncio.shield(svc.bus.close())
        shutdown_tracing()
        log.info("%s stopped", svc.instance)
    if failure is not None:
        raise StartFailed(svc.name, failure) from failure


async def _release(svc: Service) -> None:
    try:
        await svc.stop()
    except Exception:  # noqa: BLE001
        log.exception("%s: stop() failed", svc.instance)


async def _leave(svc: Service) -> None:
    try:
        await _release(svc)
    finally:
        try:
            msg = svc.announce()
            msg.leaving = True
            await svc.bus.publish(svc.heartbeat_subject, msg)
            await svc.bus.nc.flush(timeout=1)
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


def _install_stop_signals() -> None:
    def stop(sig: int, frame: object) -> None:
        raise Stopped(signal.Signals(sig).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def service_main(section: str, cfg_cls: type, factory: Callable[[Any], Service], argv: list[str] | None = None) -> int:
    """Exit codes: 0 stopped, 1 could not start (one line on stderr says why), 2 a bad setting."""
    name = section  # the service's one name (shared/names.py): settings table, tracer, logs
    _install_stop_signals()
    try:
        return _serve(section, name, cfg_cls, factory, argv)
    except KeyboardInterrupt:  # Stopped, or SIGINT after the loop gave the signal back
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # already on the way out
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        unlink_own()


def _serve(section: str, name: str, cfg_cls: type, factory: Callable[[Any], Service], argv: list[str] | None) -> int:
    args = config_parser(f"dualpath service {name}", cfg_cls).parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k != "config" and v is not None}
    try:
        cfg = load_config(cfg_cls, section, file=args.config or os.environ.get("DUALPATH_CONFIG"),
                          overrides=overrides, common=CommonConfig)
        check_common(cfg)
    except ConfigError as exc:
        print(f"{section}: {exc}", file=sys.stderr)
        return 2
    setup_logging(section, cfg.log_level)
    if cfg.nice:
        log.info("niceness %d (nice %+d)", add_niceness(cfg.nice), cfg.nice)
    reap_orphans()  # segments of processes killed with SIGKILL before they could unlink them
    try:
        try:
            svc = factory(cfg)
        except (PortInUse, ConfigError):
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. a model that cannot be found: one line, traceback in the log
            raise StartFailed(name, exc) from exc
        setup_tracing(name, svc.instance)
        import uvloop

        uvloop.run(run_service(svc))
    except ConfigError as exc:
        print(f"{section}: {exc}", file=sys.stderr)
        return 2
    except (PortInUse, BusUnavailable, StartFailed) as exc:
        log.error("%s", exc, exc_info=isinstance(exc, StartFailed))
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 1
    finally:
        _install_stop_signals()  # the loop gave the signals back to their defaults
    return 0
