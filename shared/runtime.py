"""The common life of a service process: config -> uvloop -> lifespan -> signals -> drain.

Owns: the CLI flags every service shares (generated from its config dataclass),
logging and tracing set-up, the bus connection (and its drop counters on `/metrics`),
the `/metrics` server, the heartbeat loop, and the one TaskGroup that owns every task of the service.
Shutdown: SIGTERM/SIGINT -> stop Event -> announce `leaving` -> service.stop()
-> cancel tasks -> drain the bus -> flush spans.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

from prometheus_client.core import CounterMetricFamily
from starlette.applications import Starlette
from starlette.routing import Route

from shared.bus import Bus
from shared.config import ConfigError, load_config
from shared.http import HttpServer
from shared.logs import setup_logging
from shared.messages.registry import Announce
from shared.messages.subjects import Subjects
from shared.metrics import Metrics
from shared.tracing import setup_tracing, shutdown_tracing

log = logging.getLogger("runtime")


@dataclass(frozen=True)
class CommonConfig:
    nats_url: str = "nats://127.0.0.1:4222"  # one URL or a comma-separated cluster list
    namespace: str = "dp"  # subject prefix: isolates one mesh on a shared NATS
    node: str = "node0"  # the host/node this process serves
    instance: str = ""  # unique process id; empty = random
    host: str = "127.0.0.1"  # where this process's listeners bind (loopback by default)
    metrics_port: int = 0  # /metrics port; 0 = any free port (announced)
    heartbeat_s: float = 0.5  # announce period
    log_level: str = "info"
    # NATS credentials (any one scheme); secrets never appear in logs, traces or repr()
    nats_user: str = ""
    nats_password: str = dataclasses.field(default="", repr=False)
    nats_token: str = dataclasses.field(default="", repr=False)
    nats_creds: str = ""  # path of a .creds file (JWT + nkey seed)
    nats_nkey_seed: str = ""  # path of an nkey seed file
    nats_tls_ca: str = ""  # CA bundle: enables TLS to the NATS server
    nats_tls_cert: str = ""  # client certificate (mutual TLS)
    nats_tls_key: str = ""  # client key (mutual TLS)


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

    @abstractmethod
    async def start(self) -> None:
        """Subscribe and start owned tasks (in self.tasks). Called once, after connect."""

    @abstractmethod
    def announce(self) -> Announce:
        """The current announcement (sent at start and every heartbeat)."""

    async def stop(self) -> None:
        """Stop intake and release resources; tasks are cancelled afterwards."""

    def routes(self) -> list[Route]:
        """Extra HTTP routes on the metrics server (the scheduler serves its API elsewhere)."""
        return []

    def spawn(self, coro, name: str | None = None) -> asyncio.Task:
        assert self.tasks is not None, "spawn() before start"
        task = self.tasks.create_task(coro, name=name)
        self.owned.add(task)
        task.add_done_callback(self.owned.discard)
        return task


class BusCounters:
    """A Prometheus collector reading the bus's own counters at scrape time (the bus stays
    metrics-free): messages dropped undecoded, and handlers that raised."""

    def __init__(self, bus: Bus):
        self.bus = bus

    def collect(self):
        yield CounterMetricFamily("dualpath_bus_bad_messages", "Bus messages dropped: did not decode",
                                  value=self.bus.bad_messages)
        yield CounterMetricFamily("dualpath_bus_handler_errors", "Bus handlers that raised (message dropped)",
                                  value=self.bus.handler_errors)


async def _heartbeat(svc: Service, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await svc.bus.publish(svc.subjects.heartbeat, svc.announce())
        except Exception as exc:  # noqa: BLE001 - reconnecting bus; keep beating
            log.warning("heartbeat failed: %s", exc)
        try:
            await asyncio.wait_for(stop.wait(), svc.cfg.heartbeat_s)
        except asyncio.TimeoutError:
            pass


async def run_service(svc: Service, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    svc.bus = await Bus.connect(svc.cfg.nats_url, svc.instance, **nats_options(svc.cfg))
    svc.metrics.registry.register(BusCounters(svc.bus))
    routes = [Route("/metrics", svc.metrics.endpoint)] + svc.routes()
    http = HttpServer(Starlette(routes=routes), svc.cfg.host, svc.cfg.metrics_port)
    svc.metrics_url = http.url + "/metrics"
    try:
        async with asyncio.TaskGroup() as tg:
            svc.tasks = tg
            tg.create_task(http.serve(), name="metrics-http")
            await svc.start()
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


async def _leave(svc: Service) -> None:
    try:
        await svc.stop()
    finally:
        msg = svc.announce()
        msg.leaving = True
        try:
            await svc.bus.publish(svc.subjects.heartbeat, msg)
            await svc.bus.nc.flush(timeout=1)
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


def nats_options(cfg: CommonConfig) -> dict[str, Any]:
    """nats-py connect options for the configured credentials (user/password, token, creds, nkey, TLS)."""
    opts: dict[str, Any] = {}
    if cfg.nats_user:
        opts.update(user=cfg.nats_user, password=cfg.nats_password)
    if cfg.nats_token:
        opts["token"] = cfg.nats_token
    if cfg.nats_creds:
        opts["user_credentials"] = cfg.nats_creds
    if cfg.nats_nkey_seed:
        opts["nkeys_seed"] = cfg.nats_nkey_seed
    if cfg.nats_tls_ca or cfg.nats_tls_cert:
        import ssl

        ctx = ssl.create_default_context(cafile=cfg.nats_tls_ca or None)
        if cfg.nats_tls_cert:
            ctx.load_cert_chain(cfg.nats_tls_cert, cfg.nats_tls_key or None)
        opts["tls"] = ctx
    return opts


def config_parser(prog: str, cfg_cls: type) -> argparse.ArgumentParser:
    """Every config field becomes a flag: `--nats-url`, `--node`, `--kv-blocks`, ..."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--config", help="TOML settings file ([common] + a table per service)")
    parser.add_argument("--nats", dest="nats_url", help="alias of --nats-url")
    for f in dataclasses.fields(cfg_cls):
        if f.name == "nats_url":
            parser.add_argument("--nats-url", dest="nats_url")
            continue
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None, metavar="V")
    return parser


def service_main(section: str, cfg_cls: type, factory: Callable[[Any], Service], argv: list[str] | None = None) -> int:
    """Entry point used by `python -m services.<name>` and `dualpath service <name>`."""
    args = config_parser(f"dualpath service {section.replace('_', '-')}", cfg_cls).parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k != "config" and v is not None}
    try:
        cfg = load_config(cfg_cls, section, file=args.config or os.environ.get("DUALPATH_CONFIG"), overrides=overrides)
    except ConfigError as exc:
        print(f"{section}: {exc}", file=sys.stderr)
        return 2
    setup_logging(section, cfg.log_level)
    svc = factory(cfg)
    setup_tracing(section.replace("_", "-"), svc.instance)
    try:
        import uvloop

        uvloop.run(run_service(svc))
    except KeyboardInterrupt:
        pass
    return 0
