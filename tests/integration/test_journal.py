"""The request journal against a real nats-server: deduplication, survival across restarts,
and running without JetStream."""
from __future__ import annotations

import asyncio
import time
import uuid

import nats
import pytest

from services.scheduler.journal import Journal, JournalUnavailable, stream_name
from shared.messages.journal import Accepted
from shared.messages.work import Sampling
from tests.integration.natsutil import NatsServer

pytestmark = pytest.mark.integration


@pytest.fixture
def js_server(tmp_path):
    server = NatsServer(tmp_path, jetstream=True).start()
    yield server
    server.stop()


def _acc(rid: str) -> Accepted:
    return Accepted(rid, time.time(), 9, Sampling(max_tokens=4), "scheduler-a")


async def _with_journal(url: str, ns: str, body):
    nc = await nats.connect(url)
    try:
        journal = Journal(nc, ns)
        await journal.ensure()
        return await body(journal)
    finally:
        await nc.close()


def test_same_request_id_is_stored_once(js_server):
    ns = "dp" + uuid.uuid4().hex[:8]

    async def body(j: Journal):
        for _ in range(3):  # a retried accept of one id
            assert await j.accepted("r1", _acc("r1"))
        assert await j.accepted("r2", _acc("r2"))
        for _ in range(2):
            assert await j.finished("r2", "ok", 4)
        info = await j.js.stream_info(stream_name(ns))
        return info.state.messages, [a.req_id for a in await j.unfinished()]

    messages, pending = asyncio.run(_with_journal(js_server.url, ns, body))
    assert messages == 3  # r1 accepted, r2 accepted, r2 finished
    assert pending == ["r1"]


def test_unfinished_requests_survive_a_restart(js_server):
    ns = "dp" + uuid.uuid4().hex[:8]
    before = time.time()

    async def first_life(j: Journal):
        for rid in ("a", "b", "c"):
            await j.accepted(rid, _acc(rid))
        await j.finished("b", "ok", 4)
        for rid in ("d", "e", "f"):  # queued together: the writer sends them as one batch
            j.note_accepted(_acc(rid))
        j.note_finished("e", "ok", 2)
        writer = asyncio.create_task(j.run())
        while not j.queue.empty():
            await asyncio.sleep(0.01)
        info = await j.js.stream_info(stream_name(ns))
        while info.state.messages < 5:  # the batch landed (one message for four records)
            await asyncio.sleep(0.01)
            info = await j.js.stream_info(stream_name(ns))
        writer.cancel()

    asyncio.run(_with_journal(js_server.url, ns, first_life))
    js_server.stop()  # the server restarts too: the journal is on disk, not in memory
    js_server.start()

    async def second_life(j: Journal):  # a new client and a new Journal, as after a scheduler restart
        return ([a.req_id for a in await j.unfinished()],
                [a.req_id for a in await j.unfinished(since=before)],
                await j.unfinished(since=time.time() + 60),
                await j.unfinished(scheduler="someone-else"))

    everything, recent, future, others = asyncio.run(_with_journal(js_server.url, ns, second_life))
    assert everything == ["a", "c", "d", "f"]
    assert recent == ["a", "c", "d", "f"]
    assert future == [] and others == []


def test_empty_journal_reads_as_nothing(js_server):
    assert asyncio.run(_with_journal(js_server.url, "dp" + uuid.uuid4().hex[:8], lambda j: j.unfinished())) == []


def test_server_without_jetstream_gives_journal_unavailable(tmp_path):
    server = NatsServer(tmp_path, jetstream=False, log="nats-nojs.log").start()
    try:
        with pytest.raises(JournalUnavailable) as info:
            asyncio.run(_with_journal(server.url, "dp" + uuid.uuid4().hex[:8], lambda j: j.unfinished()))
        assert "JetStream" in info.value.reason
    finally:
        server.stop()


def test_a_write_that_cannot_land_fails_softly(js_server):
    ns = "dp" + uuid.uuid4().hex[:8]

    async def body(j: Journal):
        await j.js.delete_stream(stream_name(ns))  # nothing stores {ns}.journal.> any more
        ok = await j.accepted("lost", _acc("lost"))  # must not raise: the request goes on without it
        return ok, j.failures

    ok, failures = asyncio.run(_with_journal(js_server.url, ns, body))
    assert not ok and failures == 1
