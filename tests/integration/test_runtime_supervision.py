"""A background task that raises does not stop its service (real nats-server, the real runtime).

`Service.spawn` supervises: the exception is logged with its traceback, counted in
`dualpath_task_failures_total{task=...}` on the service's /metrics, handed to the task's
`on_error` (here: the request it served gets an error reply), and the service keeps
answering requests and heartbeating.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import re
import uuid
import warnings

import httpx
import pytest

from shared.bus import Bus, Delivery
from shared.messages.registry import StorageGatewayAnnounce
from shared.messages.endpoints import EP
from shared.messages.traffic_manager import Reserve, Reserved
from shared.runtime import Service, run_service
from shared.service_config import CommonConfig
from tests.integration.natsutil import NatsServer

pytestmark = pytest.mark.integration


class Boom(RuntimeError):
    """What the failing task raises."""


class EchoService(Service):
    """A reserve (the traffic manager's request/reply endpoint) for engine `echo` is answered at once; one for
    `boom` spawns a task that raises, answered by its on_error."""

    name = "echo"

    async def start(self) -> None:
        await self.bus.subscribe(self.subjects.at(EP.TM_RESERVE, engine="echo"), self._on_echo)
        await self.bus.subscribe(self.subjects.at(EP.TM_RESERVE, engine="boom"), self._on_boom)

    def announce(self) -> StorageGatewayAnnounce:
        return StorageGatewayAnnounce(instance=self.instance, node=self.cfg.node, metrics_url=self.metrics_url)

    async def _on_echo(self, msg: Reserve, d: Delivery) -> None:
        await d.respond(Reserved(slots=[len(msg.req_id)]))

    async def _on_boom(self, msg: Reserve, d: Delivery) -> None:
        self.spawn(self._explode(msg), name=f"explode-{msg.req_id}",
                   on_error=lambda exc: d.respond(Reserved(ok=False, error=f"{type(exc).__name__}: {exc}")))

    async def _explode(self, msg: Reserve) -> None:
        await asyncio.sleep(0)
        raise Boom(f"task for {msg.req_id} broke")


def failures(metrics_url: str) -> dict[str, float]:
    text = httpx.get(metrics_url, timeout=10).text
    return {k: float(v) for k, v in re.findall(r'^dualpath_task_failures_total\{task="([^"]+)"\} (\S+)$', text, re.M)}


async def _beats(bus: Bus, ns: str, instance: str) -> asyncio.Queue:
    """A queue that receives each heartbeat of `instance` from now on."""
    q: asyncio.Queue = asyncio.Queue()

    async def on_hb(msg, d: Delivery) -> None:
        if msg.instance == instance:
            q.put_nowait(msg)

    await bus.subscribe(EP.HEARTBEAT.at(ns), on_hb)
    return q


def test_a_task_that_raises_is_counted_answered_and_the_service_keeps_serving(tmp_path, caplog):
    nats = NatsServer(tmp_path).start()
    ns = "t" + uuid.uuid4().hex[:8]
    cfg = CommonConfig(nats_url=nats.url, namespace=ns, instance=f"echo-{ns}", heartbeat_s=0.05)
    svc = EchoService(cfg)

    async def scenario() -> None:
        stop = asyncio.Event()
        life = asyncio.ensure_future(run_service(svc, stop))
        bus = await Bus.connect(nats.url, "test")
        try:
            beats = await _beats(bus, ns, svc.instance)
            await beats.get()  # started and heartbeating
            boom = EP.TM_RESERVE.at(ns, engine="boom")
            answers = [await bus.request(boom, Reserve(f"r{i}", 1), timeout=60) for i in range(3)]
            assert [a.ok for a in answers] == [False] * 3
            assert answers[0].error == "Boom: task for r0 broke"
            assert not life.done(), "the failing task took the service down"
            counted = await asyncio.to_thread(failures, svc.metrics_url)
            assert counted == {"explode": 3.0}  # one label per kind of task, not per request
            echo = await bus.request(EP.TM_RESERVE.at(ns, engine="echo"), Reserve("abcd", 1), timeout=60)
            assert echo.slots == [4]
            while not beats.empty():
                beats.get_nowait()
            await beats.get()  # still heartbeating after the failures
        finally:
            await bus.close()
            stop.set()
            await life  # a clean stop: run_service returns instead of raising the task's error

    try:
        with caplog.at_level(logging.ERROR, logger="runtime"):
            asyncio.run(scenario())
    finally:
        nats.stop()
    logged = [r for r in caplog.records if "task explode-r0 failed" in r.getMessage()]
    assert logged and logged[0].exc_info and logged[0].exc_info[0] is Boom  # with its traceback


def test_a_task_cancelled_before_it_ran_leaves_no_unawaited_coroutine():
    """Shutdown cancels tasks that may not have started: their coroutine is closed, not leaked."""
    svc = EchoService(CommonConfig(instance="echo-cancel"))

    async def scenario() -> None:
        async with asyncio.TaskGroup() as tg:
            svc.tasks = tg
            svc.spawn(svc._explode(Reserve("never", 1)), name="explode-never").cancel()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(scenario())
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
    assert svc.m_task_failures.labels("explode")._value.get() == 0  # a cancel is not a failure
