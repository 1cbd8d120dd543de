"""A stored-KV load that dies mid-layers fails the waiting prefill at once, on the wire.

A real prefill engine process (tiny model, real NATS) with every deadline at 600 s; the test
plays its traffic-manager: it answers the engine's FetchKV with "read done, 3 hits", "layer 0
in KV memory", then a `FetchFailed` (kv_transfer). The engine's answer must be a retryable
error event for that request -- which can only come from the error on the wire, since the
layer wait and the transfer deadline would take 600 s -- and the engine must go on serving
(a second prompt gets its first token) with every KV block free again.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

import pytest

from shared.bus import Bus
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.endpoints import EP
from shared.messages.registry import EngineAnnounce
from shared.messages.stream import TokenEvent
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import FetchFailed, FetchKV, LayersLoaded, ReadFinished
from shared.messages.work import PrefillWork, Sampling
from tests.unit.plan_util import pe_plan
from tests.integration.natsutil import NatsServer

pytestmark = pytest.mark.integration
BS = 16
ENGINE = "pe-lf"


@pytest.fixture
def nats(tmp_path):
    server = NatsServer(tmp_path).start()
    yield server
    server.stop()


def _engine(url: str, ns: str, log) -> subprocess.Popen:
    flags = ["--nats", url, "--namespace", ns, "--engine", ENGINE, "--model", "tiny", "--block-size", str(BS),
             "--kv-blocks", "32", "--handoff-timeout-s", "600", "--heartbeat-s", "0.2"]
    return subprocess.Popen([sys.executable, "-m", "services.prefill_engine", *flags], stdout=subprocess.DEVNULL,
                            stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})


async def _scenario(url: str, ns: str) -> dict:
    subjects = Subjects(ns)
    out = subjects.at(EP.SCHED_OUT, scheduler="lf")
    bus = await Bus.connect(url, "test-tm", wait_s=10)
    fetches: asyncio.Queue[FetchKV] = asyncio.Queue()
    events: asyncio.Queue[TokenEvent] = asyncio.Queue()
    announced: asyncio.Queue[EngineAnnounce] = asyncio.Queue()

    async def on_fetch(msg, d):
        await fetches.put(msg)

    async def on_event(msg, d):
        await events.put(msg)

    async def on_announce(msg, d):
        if isinstance(msg, EngineAnnounce) and msg.engine == ENGINE and msg.model_id:
            await announced.put(msg)

    await bus.subscribe(subjects.at(EP.TM_FETCH, engine=ENGINE), on_fetch)
    await bus.subscribe(out, on_event)
    await bus.subscribe(subjects.at(EP.HEARTBEAT), on_announce)
    try:
        await announced.get()  # the engine is up: model loaded, subscribed
        prompt = list(range(1, 3 * BS + 6))
        keys = [bytes([i]) * 16 for i in range(3)]
        await bus.publish(subjects.at(EP.PE_WORK, engine=ENGINE), PrefillWork(
            "lf-1#0", prompt, Sampling(max_tokens=8), "de-nowhere", out, block_keys=keys,
            plan=pe_plan(3, ENGINE)))
        fetch = await fetches.get()
        loaded = subjects.at(EP.PE_LOADED, engine=ENGINE)
        await bus.publish(loaded, ReadFinished(fetch.req_id, 3))  # read done: 3 hits in the buffer
        await bus.publish(loaded, LayersLoaded(fetch.req_id, 0))  # layer 0 in KV memory, then the copy dies
        await bus.publish(loaded, FetchFailed(fetch.req_id, ErrorCode.KV_TRANSFER, "layer copy failed: peer gone"))
        failed = await events.get()
        await bus.publish(subjects.at(EP.PE_WORK, engine=ENGINE), PrefillWork(
            "lf-2#0", prompt[:20], Sampling(max_tokens=1), "de-nowhere", out))
        served = await events.get()
        while (a := await announced.get()).free_blocks != a.total_blocks or a.seq:
            pass  # wait for an announcement with every block free and nothing held
        return {"fetch": fetch, "failed": failed, "served": served, "free": a}
    finally:
        await bus.close()


def test_a_layer_copy_that_dies_fails_the_prefill_at_once_and_the_engine_keeps_serving(nats, tmp_path):
    ns = f"lf{uuid.uuid4().hex[:8]}"
    with open(tmp_path / "pe.log", "w") as log:
        pe = _engine(nats.url, ns, log)
        try:
            got = asyncio.run(_scenario(nats.url, ns))
        finally:
            pe.terminate()
            try:
                pe.wait(60)  # a clean stop is asserted below; this only keeps a broken one from hanging the run
            except subprocess.TimeoutExpired:
                pe.kill()
                pe.wait()
    fetch, failed, served = got["fetch"], got["failed"], got["served"]
    assert fetch.req_id == "lf-1#0" and fetch.block_keys == [bytes([i]) * 16 for i in range(3)]
    assert len(fetch.dst_blocks) == 3
    assert fetch.pe_blocks == 3  # the scheduler's count, passed on: every hit on the PE path
    assert failed.req_id == "lf-1#0" and failed.finish is FinishReason.ERROR and failed.retryable, failed
    assert failed.code is ErrorCode.KV_TRANSFER
    assert "peer gone" in failed.error and failed.source == ENGINE
    assert served.req_id == "lf-2#0" and served.finish is FinishReason.LENGTH and len(served.tokens) == 1, served
    assert pe.returncode == 0, (tmp_path / "pe.log").read_text()[-2000:]
