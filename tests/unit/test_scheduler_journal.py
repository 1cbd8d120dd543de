"""The request journal's pure parts: record encoding, stream naming, accepted-minus-finished."""
from __future__ import annotations

import asyncio
import contextlib

import msgspec
import pytest

from services.scheduler.journal import BATCH, Journal, JournalUnavailable, decode, encode, fold, stream_name
from shared.messages.journal import Accepted, Finished
from shared.messages.work import Sampling

pytestmark = pytest.mark.unit


def _acc(rid: str, at: float = 1.0, key: str = "") -> Accepted:
    return Accepted(rid, at, 12, Sampling(temperature=0.5, max_tokens=7), "scheduler-a", key)


def test_records_round_trip_through_their_tagged_encoding():
    for entry in (_acc("r1", key="client-key-1"), _acc("r2"), Finished("r1", "ok", 7, 2.5)):
        assert decode(encode(entry)) == entry
    assert b'"kind"' not in encode(_acc("r1"))  # msgspec's default tag field is "type"
    assert msgspec.json.decode(encode(Finished("r1", "error")))["type"] == "finished"


def test_unknown_record_kind_does_not_decode():
    with pytest.raises(msgspec.DecodeError):
        decode(b'{"type": "rewound", "req_id": "r1"}')


def test_fold_is_accepted_minus_finished_in_acceptance_order():
    entries = [_acc("r1"), _acc("r2"), _acc("r3"), Finished("r2", "ok", 3)]
    assert [a.req_id for a in fold(entries)] == ["r1", "r3"]


def test_fold_ignores_record_order_and_duplicates():
    # finished may land before accepted (both are written in the background); a retried
    # accept keeps its first record; a finished without an accepted is ignored
    entries = [Finished("r1", "ok"), _acc("r1"), _acc("r2", at=1.0), _acc("r2", at=9.0), Finished("ghost", "ok")]
    out = fold(entries)
    assert [(a.req_id, a.accepted_at) for a in out] == [("r2", 1.0)]


def test_fold_of_nothing_is_nothing():
    assert fold([]) == []


def test_stream_name_is_a_legal_jetstream_name():
    assert stream_name("dp1234") == "DP_dp1234_REQUESTS"
    assert stream_name("team.a b*>") == "DP_team_a_b___REQUESTS"


def test_unavailable_error_carries_its_fields():
    exc = JournalUnavailable("127.0.0.1:4222", "JetStream is not enabled")
    assert (exc.server, exc.reason) == ("127.0.0.1:4222", "JetStream is not enabled")
    assert "127.0.0.1:4222" in str(exc)


class _FakeJetStream:
    def __init__(self, fail: bool = False):
        self.sent: list[tuple[str, bytes, dict]] = []
        self.fail = fail

    async def publish(self, subject, payload, headers=None):
        if self.fail:
            raise TimeoutError("no reply")
        self.sent.append((subject, payload, headers))


class _FakeClient:
    def __init__(self, js):
        self.js = js

    def jetstream(self, **opts):
        return self.js


def _drain(journal: Journal) -> None:
    async def run():
        writer = asyncio.create_task(journal.run())
        while not journal.queue.empty():
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer

    asyncio.run(run())


def test_a_noted_record_alone_is_written_as_itself_with_its_dedup_id():
    js = _FakeJetStream()
    journal = Journal(_FakeClient(js), "dpx", linger_s=0)

    async def one_at_a_time():
        writer = asyncio.create_task(journal.run())
        for note in (lambda: journal.note_accepted(_acc("r1")), lambda: journal.note_finished("r1", "ok", 5)):
            n = len(js.sent)
            note()
            while len(js.sent) == n:  # written before the next is noted
                await asyncio.sleep(0)
        writer.cancel()

    asyncio.run(one_at_a_time())
    assert [(subj, hdr["Nats-Msg-Id"]) for subj, _, hdr in js.sent] == [
        ("dpx.journal.accepted", "r1"), ("dpx.journal.finished", "r1:finished")]
    assert [type(decode(data)).__name__ for _, data, _ in js.sent] == ["Accepted", "Finished"]


def test_records_queued_together_are_one_batch_in_order_and_fold_as_their_records():
    js = _FakeJetStream()
    journal = Journal(_FakeClient(js), "dpx", linger_s=0)
    for i in range(BATCH + 3):  # a backlog: one full batch, then the rest
        journal.note_accepted(_acc(f"r{i}"))
    journal.note_finished("r0", "ok", 5)
    _drain(journal)
    assert [subj for subj, _, _ in js.sent] == ["dpx.journal.batch"] * 2
    entries = [e for _, data, _ in js.sent for e in decode(data)]
    assert [e.req_id for e in entries] == [f"r{i}" for i in range(BATCH + 3)] + ["r0"]
    assert [a.req_id for a in fold(entries)] == [f"r{i}" for i in range(1, BATCH + 3)]


def test_records_noted_within_the_linger_go_together():
    js = _FakeJetStream()
    journal = Journal(_FakeClient(js), "dpx", linger_s=0.01)

    async def trickle():
        writer = asyncio.create_task(journal.run())
        journal.note_accepted(_acc("r1"))
        await asyncio.sleep(0)  # the writer took r1 and lingers
        journal.note_finished("r1", "ok", 5)
        while not js.sent:
            await asyncio.sleep(0.005)
        writer.cancel()

    asyncio.run(trickle())
    assert [subj for subj, _, _ in js.sent] == ["dpx.journal.batch"]
    assert [type(e).__name__ for e in decode(js.sent[0][1])] == ["Accepted", "Finished"]


def test_a_failed_batch_counts_each_of_its_records():
    journal = Journal(_FakeClient(_FakeJetStream(fail=True)), "dpx", linger_s=0)
    for rid in ("r1", "r2", "r3"):
        journal.note_accepted(_acc(rid))
    _drain(journal)
    assert journal.failures == 3


def test_a_failed_write_is_counted_never_raised():
    journal = Journal(_FakeClient(_FakeJetStream(fail=True)), "dpx", linger_s=0)
    journal.note_accepted(_acc("r1"))
    _drain(journal)
    assert journal.failures == 1
    assert not asyncio.run(journal.accepted("r2", _acc("r2")))
    assert journal.failures == 2
