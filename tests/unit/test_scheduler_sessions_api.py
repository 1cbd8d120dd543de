"""SGLang's session endpoints (services/scheduler/sessions_api.py) and the close's way to the sessions:
/open_session answers the session's id, /close_session ends the session at the scheduler (in
process, or from a front-door worker through its dispatch core), which ends its retention in the
store and gives back what was staged for it."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.testclient import TestClient

from services.scheduler.api import _read_body
from services.scheduler.protocol import ApiError
from services.scheduler.sessions_api import session_routes
from shared.messages.subjects import Subjects
from tests.unit.test_scheduler_prefetcher import _done, _prefetcher, _until

pytestmark = pytest.mark.unit


class FakeFront:
    def __init__(self):
        self.cfg = SimpleNamespace(max_body_bytes=1024)
        self.ended: list[str] = []

    async def end_session(self, session: str) -> None:
        self.ended.append(session)


def _client(front: FakeFront) -> TestClient:
    app = Starlette(routes=session_routes(front, _read_body))
    app.add_exception_handler(ApiError, lambda req, exc: JSONResponse(exc.body(), status_code=exc.status))
    return TestClient(app)


def test_open_session_answers_the_id_it_was_given_or_a_new_one():
    front = FakeFront()
    with _client(front) as c:
        r = c.post("/open_session", json={"capacity_of_str_len": 1000, "session_id": "sess-1", "timeout": 30})
        assert (r.status_code, r.json()) == (200, "sess-1")
        a, b = c.post("/open_session", json={"capacity_of_str_len": 1000}).json(), c.post("/open_session").json()
        assert a.startswith("session-") and b.startswith("session-") and a != b
        bad = c.post("/open_session", json={"session_id": 5})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "session_id"
    assert front.ended == []  # opening ends nothing


def test_close_session_ends_the_named_session_and_a_missing_id_is_a_400():
    front = FakeFront()
    with _client(front) as c:
        r = c.post("/close_session", json={"session_id": "sess-1"})
        assert r.status_code == 200 and r.content == b""
        for body in ({}, {"session_id": ""}, {"session_id": ["x"]}):
            bad = c.post("/close_session", json=body)
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "session_id", bad.text
        assert c.post("/close_session", content=b"x" * 2048).status_code == 413
    assert front.ended == ["sess-1"]


def test_a_workers_close_goes_to_the_dispatch_core_which_ends_the_session():
    from services.scheduler.doors import FrontDoors
    from shared.messages.front import Answer, Ask
    from services.scheduler.worker import FrontWorker

    asked = []

    async def request(subject, msg, timeout):
        asked.append((subject, msg))
        return Answer()

    worker = SimpleNamespace(core="c", subjects=Subjects("t"),
                             bus=SimpleNamespace(nc=SimpleNamespace(is_connected=True), request=request))
    worker._ask = lambda what, session="": FrontWorker._ask(worker, what, session)
    asyncio.run(FrontWorker.end_session(worker, "sess-2"))
    assert asked == [("t.scheduler.c.ask", Ask("close_session", "sess-2"))]

    core, answers = FakeFront(), []
    doors = FrontDoors(core)
    doors.info = lambda: None

    async def respond(answer):
        answers.append(answer)
    asyncio.run(doors._on_ask(asked[0][1], SimpleNamespace(respond=respond)))
    assert core.ended == ["sess-2"] and answers[0].status == 200


def test_ending_a_session_releases_its_staging_and_its_retention():
    from shared.messages.front import Hint
    from shared.messages.storage_gateway import Retain
    from shared.messages.traffic_manager import Release

    async def go():
        pf, bus = _prefetcher()
        pf.done(_done(list(range(300)), Hint(session="s", tool_s=0.05)), "ok")
        await _until(lambda: pf.index.by_owner)
        owner = next(iter(pf.index.by_owner))
        pf.end_session("s", None)  # no store layout known (yet): the staging still goes back
        await _until(lambda: any(isinstance(m, Release) and m.req_id == owner for _, m in bus.sent))
        assert not any(isinstance(m, Retain) and m.release for _, m in bus.sent)
        await pf.close_session("s")  # (what the scheduler's /close_session calls)
        await _until(lambda: any(isinstance(m, Retain) and m.release and m.session == "s" for _, m in bus.sent))
    asyncio.run(go())
