"""Dispatch rounds are asked for only when they can place something: a heartbeat while nothing
waits costs no round; one while requests wait does."""
from __future__ import annotations

import asyncio

import pytest

from services.scheduler.app import SchedulerService
from services.scheduler.config import SchedulerConfig
from shared.messages.registry import EngineAnnounce
from shared.sched.dispatch import Job

pytestmark = pytest.mark.unit


@pytest.fixture
def svc():
    s = SchedulerService(SchedulerConfig(model="tiny", http_port=0, instance="sched-kicks"))
    yield s
    s.http_sock.close()


def heartbeat(svc: SchedulerService, engine: str = "e0") -> None:
    asyncio.run(svc._on_announce(EngineAnnounce(f"i-{engine}", "n0", engine=engine), None))


def test_heartbeats_while_nothing_waits_ask_for_no_round(svc):
    for i in range(50):
        heartbeat(svc, f"e{i}")
    assert not svc.kick.is_set()
    assert len(svc.view.engines) == 50  # the view still heard them all


def test_a_heartbeat_while_requests_wait_asks_for_a_round(svc):
    svc.dispatcher.enqueue(Job("r1", 10, 5))
    heartbeat(svc)
    assert svc.kick.is_set()


def test_a_repeat_heartbeat_that_changes_nothing_asks_for_no_round(svc):
    heartbeat(svc)
    svc.dispatcher.enqueue(Job("r1", 10, 5))
    heartbeat(svc)  # the same engine again: nothing a round uses moved
    assert not svc.kick.is_set()
    asyncio.run(svc._on_announce(EngineAnnounce("i-e0", "n0", engine="e0", total_blocks=99), None))
    assert svc.kick.is_set()  # its KV size changed: a round is due
