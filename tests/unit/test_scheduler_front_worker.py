"""A front-door worker's judgements on engine output (services/scheduler/events.py, worker.py)."""
import pytest

from services.scheduler.events import OutputRouter
from services.scheduler.inflight import InFlight
from services.scheduler.worker import running_without
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.endpoints import EP
from shared.messages.stream import StepEvents, TokenEvent
from shared.messages.work import Sampling

pytestmark = pytest.mark.unit


def router(rec: InFlight, resumes: list):
    firsts = []
    r = OutputRouter({rec.req_id: rec}, lambda rec, ev, source: resumes.append((ev.code, source)) or True,
               lambda rec, source: firsts.append(source))
    return r, firsts


def test_the_worker_learns_both_engines_and_tells_the_core_once_when_prefill_is_over():
    rec = InFlight("r", [1, 2, 3], Sampling(max_tokens=8))
    r, firsts = router(rec, [])
    r.route(TokenEvent("r#0", [7], 0, source="p0"))
    r.route(StepEvents([TokenEvent("r#0", [8], 1), TokenEvent("other#0", [9], 1)], "d0"))
    r.route(StepEvents([TokenEvent("r#0", [8], 1)], "d0"))  # a duplicate: dropped
    assert firsts == ["p0"] and rec.de == "d0"
    assert rec.tokens == [7, 8] and rec.events.qsize() == 2


def test_an_old_attempts_tokens_never_reach_the_client():
    rec = InFlight("r", [1, 2, 3], Sampling(max_tokens=8))
    rec.attempt = 1
    r, firsts = router(rec, [])
    r.route(StepEvents([TokenEvent("r#0", [8], 1)], "d0"))
    assert rec.events.empty() and not firsts


def test_a_silent_prefill_engine_is_ignored_once_decode_streams_and_resumed_before():
    rec = InFlight("r", [1, 2, 3], Sampling(max_tokens=8))
    rec.pe, rec.de = "p0", "d0"
    rec.next_index = 1  # only the first token: decode has not produced one yet
    assert not running_without(rec, "p0")
    rec.next_index = 3
    assert running_without(rec, "p0")
    assert not running_without(rec, "d0")  # the decode engine itself: resume
    assert not running_without(rec, "")


def test_a_retryable_failure_goes_to_resume_not_to_the_client():
    rec = InFlight("r", [1, 2, 3], Sampling(max_tokens=8))
    resumes = []
    r, _ = router(rec, resumes)
    r.route(TokenEvent("r#0", [], 0, finish=FinishReason.ERROR, retryable=True, code=ErrorCode.ENGINE_FAILED,
                       source="p0"))
    assert resumes == [(ErrorCode.ENGINE_FAILED, "p0")] and rec.events.empty() and not rec.finished


# a worker's prompt stays with the worker: the core addresses the work to it, it fills the prompt in ----------
def _placed(rec: InFlight):
    from services.scheduler.placement import place
    from services.scheduler.view import MeshView
    from shared.sched.reads import PendingReads
    return place(rec, "p0", "d0", MeshView(), PendingReads(), rec.reply or "core.out").work


def test_a_worker_held_prompt_is_left_out_of_the_work_and_the_work_goes_to_the_worker():
    from services.scheduler.placement import addressed
    from shared.messages.endpoints import forward_subject
    from shared.messages.front import Forward
    from shared.kv.keyrun import KeyRun
    from shared.messages.subjects import Subjects

    subjects = Subjects("ns")
    held = InFlight("r", [], Sampling(max_tokens=8), reply="ns.scheduler.c-w0.out", remote_prompt=300,
                    block_keys=KeyRun(bytes(range(16)) * 4))
    held.hit_blocks = 9
    assert held.prompt_len == 300 and held.work_len == 300
    work = _placed(held)
    assert work.prompt == [] and work.block_keys == [] and work.req_id == "r#0" and work.reply == held.reply
    subject, msg = addressed(held, "p0", work, subjects)
    assert subject == forward_subject(held.reply) and isinstance(msg, Forward) and (msg.pe, msg.work) == ("p0", work)
    held.tokens, held.next_index = [7, 8], 2  # resumed after two tokens (doors.py): still no ids at the core
    held.restart()
    assert held.work_len == 302 and _placed(held).prompt == []
    own = InFlight("s", [1, 2, 3], Sampling(max_tokens=8), block_keys=[b"k" * 16])
    work = _placed(own)
    assert work.prompt == [1, 2, 3] and work.block_keys == [b"k" * 16]
    assert addressed(own, "p0", work, subjects) == (subjects.at(EP.PE_WORK, engine="p0"), work)


class _Bus:
    def __init__(self):
        self.sent = []

    async def publish(self, subject, msg, ctx=None):
        self.sent.append((subject, msg))


def test_the_worker_fills_in_the_prompt_and_the_streamed_tokens_and_drops_stale_work():
    import asyncio
    from types import SimpleNamespace

    from shared.messages.front import Forward
    from services.scheduler.worker import FrontWorker
    from shared.messages.subjects import Subjects
    from shared.messages.work import PrefillWork

    rec = InFlight("r", [1, 2, 3], Sampling(max_tokens=8))
    rec.accept(TokenEvent("r", [7, 8], 0))
    rec.restart()  # attempt 1, after the two tokens streamed
    rec.block_keys = [b"a" * 16, b"b" * 16]  # the worker's keys of prompt + streamed (FrontWorker.resume)
    worker = SimpleNamespace(inflight={"r": rec}, subjects=Subjects("ns"), bus=_Bus())
    d = SimpleNamespace(ctx=None)

    def forward(wire_id: str) -> None:
        work = PrefillWork(wire_id, [], Sampling(max_tokens=6), "d0", "ns.scheduler.c-w0.out")
        asyncio.run(FrontWorker._on_work(worker, Forward("p1", work), d))

    forward("r#0")  # an old attempt's
    forward("gone#0")  # answered meanwhile
    assert worker.bus.sent == []
    forward("r#1")
    [(subject, work)] = worker.bus.sent
    assert subject == Subjects("ns").at(EP.PE_WORK, engine="p1")
    assert work.prompt == [1, 2, 3, 7, 8] and work.req_id == "r#1"
    assert work.block_keys == [b"a" * 16, b"b" * 16]  # filled in here: the core sent none
    rec.finished = FinishReason.CANCELLED
    forward("r#1")
    assert len(worker.bus.sent) == 1


def test_a_done_that_comes_during_the_hit_lookup_finishes_the_request_once_it_is_queued():
    import asyncio
    from types import SimpleNamespace

    from services.scheduler.doors import FrontDoors
    from shared.messages.front import Done, Submit

    async def scenario():
        gateway = asyncio.Event()
        finished, tasks = [], []

        async def admit(rec):
            await gateway.wait()  # the gateway's answer is slow
            svc.inflight[rec.req_id] = rec

        svc = SimpleNamespace(inflight={}, admit=admit, finish=lambda rec, status: finished.append((rec.req_id, status)),
                              spawn=lambda coro, name=None: tasks.append(asyncio.ensure_future(coro)))
        doors, d = FrontDoors(svc), SimpleNamespace(ctx=None)
        await doors._on_front(Submit("a", "w.out", Sampling(max_tokens=4), prompt_tokens=9), d)
        await doors._on_front(Submit("b", "w.out", Sampling(max_tokens=4), prompt_tokens=9), d)  # not behind a
        await doors._on_front(Done("a", "cancelled"), d)  # the client left while a's hits were looked up
        assert finished == [] and len(tasks) == 2
        gateway.set()
        await asyncio.gather(*tasks)
        return finished, doors.admitting, set(svc.inflight)

    finished, admitting, inflight = asyncio.run(scenario())
    assert finished == [("a", "cancelled")] and admitting == {} and inflight == {"a", "b"}  # (finish is a stub)


# the store is asked by the worker, so the dispatch core queues a request without a round trip ---------------
def test_the_worker_asks_the_store_and_submits_its_answer_and_the_core_asks_none():
    import asyncio
    from types import SimpleNamespace

    from services.scheduler.hits import known_hits, lookup_hits
    from services.scheduler.oracle import OracleIndex
    from shared.messages.front import FrontInfo, Submit
    from services.scheduler.worker import FrontWorker
    from shared.kv.keyrun import KeyRun
    from shared.messages.codes import LoadMode
    from shared.messages.storage_gateway import HitReply, StoreLayout
    from shared.messages.subjects import Subjects

    layout = StoreLayout(b"f" * 16, "m", 2, 1, 8, "float32", 4)
    asked = []

    async def ask(query):
        asked.append(len(query.block_keys))
        return HitReply(blocks=2)

    sent = _Bus()
    worker = SimpleNamespace(inflight={}, info=FrontInfo(layout=layout), bus=SimpleNamespace(nc=SimpleNamespace(
        is_connected=True)), reply="w.out", _ask_hits=ask, _keys=lambda ids: FrontWorker._keys(worker, ids),
        cfg=SimpleNamespace(serve_pending_saves=False))
    worker._submit = lambda rec, msg: sent.publish("core.front", msg)
    rec = InFlight("r", list(range(13)), Sampling(max_tokens=4))  # three full blocks of 4 (the last token is computed)
    asyncio.run(FrontWorker.admit(worker, rec))
    [(_, msg)] = sent.sent
    assert isinstance(msg, Submit) and asked == [3] and msg.stored_blocks == 2 and msg.prompt == []
    assert KeyRun(msg.block_keys) == rec.block_keys == FrontWorker._keys(worker, rec.prompt)  # packed; kept here

    core = InFlight("r", [], msg.sampling, block_keys=KeyRun(msg.block_keys), remote_prompt=13, stored_blocks=msg.stored_blocks)
    assert known_hits(core, layout, OracleIndex(), None, lambda keys: 0) and core.hit_blocks == 2
    kept = InFlight("k", [], msg.sampling, block_keys=KeyRun(msg.block_keys), remote_prompt=13, stored_blocks=1)
    assert known_hits(kept, layout, OracleIndex(), None, lambda keys: 3) and kept.hit_blocks == 3  # its DE's buffer
    resumed = InFlight("q", [], msg.sampling, block_keys=KeyRun(msg.block_keys), remote_prompt=13, stored_blocks=2)
    resumed.restart()  # a new attempt: the store is asked again, by the core
    resumed.block_keys = KeyRun(msg.block_keys)
    assert not known_hits(resumed, layout, OracleIndex(), None, None)
    asyncio.run(lookup_hits(resumed, layout, OracleIndex(), ask))
    assert resumed.hit_blocks == 2 and asked == [3, 3]

    hinted = InFlight("h", list(range(13)), Sampling(max_tokens=4), hint=object())  # the core knows its prefetches
    oracle = InFlight("o", list(range(13)), Sampling(max_tokens=4), mode=LoadMode.ORACLE)
    for r in (hinted, oracle):
        asyncio.run(FrontWorker.admit(worker, r))
    assert asked == [3, 3] and [m.stored_blocks for _, m in sent.sent[1:]] == [-1, -1]
    worker.cfg.serve_pending_saves = True  # the core keys prompt + generated for the blocks a DE holds
    asyncio.run(FrontWorker.admit(worker, InFlight("s", list(range(13)), Sampling(max_tokens=4))))
    assert sent.sent[-1][1].prompt == list(range(13))
    assert Subjects("ns").at(EP.SG_HIT)  # (the subject `hits.asker` asks on)


def test_a_submit_with_the_stores_answer_is_queued_at_once_and_one_without_waits_for_its_lookup():
    import asyncio
    from types import SimpleNamespace

    from services.scheduler.doors import FrontDoors
    from shared.messages.front import Submit

    async def scenario():
        queued, tasks = [], []
        svc = SimpleNamespace(inflight={}, admit_now=lambda rec: queued.append(rec.req_id) or True,
                              spawn=lambda coro, name=None: tasks.append(asyncio.ensure_future(coro)))

        async def admit(rec):
            queued.append("looked up " + rec.req_id)
        svc.admit = admit
        doors, d = FrontDoors(svc), SimpleNamespace(ctx=None)
        await doors._on_front(Submit("a", "w.out", Sampling(max_tokens=4), prompt_tokens=9, stored_blocks=0), d)
        assert queued == ["a"] and not tasks and not doors.admitting
        await doors._on_front(Submit("b", "w.out", Sampling(max_tokens=4), prompt_tokens=9), d)  # not asked
        await asyncio.gather(*tasks)
        return queued

    assert asyncio.run(scenario()) == ["a", "looked up b"]


def test_an_event_after_a_lost_one_resumes_the_request_instead_of_waiting_for_the_gap():
    rec = InFlight("r", [1, 2, 3], Sampling(max_tokens=8))
    resumes: list = []
    r, _ = router(rec, resumes)
    r.route(TokenEvent("r#0", [7], 0, source="p0"))
    r.route(StepEvents([TokenEvent("r#0", [9], 2)], "d0"))  # index 1 never came
    assert resumes == [(ErrorCode.ENGINE_FAILED, "")] and rec.tokens == [7]


def test_a_gap_that_cannot_be_resumed_fails_the_request_on_the_wire():
    rec = InFlight("r", [1, 2, 3], Sampling(max_tokens=8))
    r = OutputRouter({"r": rec}, lambda rec, ev, source: False, lambda rec, source: None)
    r.route(TokenEvent("r#0", [7], 0, source="p0"))
    r.route(StepEvents([TokenEvent("r#0", [9], 2)], "d0"))
    events = [rec.events.get_nowait() for _ in range(rec.events.qsize())]
    assert events[-1].finish == FinishReason.ERROR and "lost in transit" in events[-1].error
