"""A request the mesh failed is answered by its ErrorCode alone: no_engine and shutting_down 503,
prompt_too_long 400, every other code (and none) 500 -- whatever the message says. Through the
real handlers (`api.build_app`) with a stand-in for the scheduler service; no NATS, no model."""
from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from services.scheduler.api import build_app
from services.scheduler.config import SchedulerConfig
from services.scheduler.protocol import HTTP_STATUS, failure
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.stream import TokenEvent

pytestmark = pytest.mark.unit

WANT = {ErrorCode.NO_ENGINE: 503, ErrorCode.SHUTTING_DOWN: 503, ErrorCode.PROMPT_TOO_LONG: 400}
# messages that a substring rule would have misread: the code decides, never the text
MISLEADING = "no engine available; prompt too long"


class Tokenizer:
    vocab_size = 100

    def decode(self, ids, skip_special_tokens=True) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


class Front:
    """The scheduler as the handlers see it: every admitted request gets `events` at once."""

    def __init__(self, events: list[TokenEvent]):
        self.cfg = SchedulerConfig()
        self.tokenizer = Tokenizer()
        self.events, self.finished = events, []

    def model_id(self) -> str:
        return "m"

    def accepts_model(self, name) -> bool:
        return True

    def max_context(self) -> int:
        return 64

    async def admit(self, rec) -> None:
        for ev in self.events:
            rec.events.put_nowait(ev)

    def cancel(self, rec, reason: str) -> None:
        pass

    def finish(self, rec, status: str) -> None:
        self.finished.append(status)

    async def metrics_endpoint(self, request):
        raise AssertionError("not asked")


def post(events: list[TokenEvent], stream: bool = False):
    front = Front(events)
    with TestClient(build_app(front)) as client:
        r = client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4, "stream": stream})
    return r, front


def failed(code: ErrorCode | None, tokens=()) -> list[TokenEvent]:
    out = [TokenEvent("x", list(tokens), 0)] if tokens else []
    return out + [TokenEvent("x", [], len(tokens), FinishReason.ERROR, MISLEADING, "pe0", code=code)]


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda c: c.value)
def test_the_status_follows_the_code_alone(code):
    r, front = post(failed(code))
    assert r.status_code == WANT.get(code, 500), r.text
    err = r.json()["error"]
    assert (err["code"], err["message"]) == (code.value, MISLEADING)
    assert err["type"] == {503: "service_unavailable", 400: "invalid_request_error"}.get(r.status_code, "engine_error")
    assert front.finished == ["error"]


def test_an_error_event_without_a_code_is_a_500():
    r, _ = post(failed(None))
    assert r.status_code == 500 and r.json()["error"]["code"] == ErrorCode.INTERNAL.value


def test_the_table_is_the_one_the_api_uses():
    assert HTTP_STATUS == WANT
    assert all(failure(c, "m").status == WANT.get(c, 500) for c in ErrorCode)


def test_a_stream_ends_with_the_code_of_its_failure():
    r, _ = post(failed(ErrorCode.KV_TRANSFER, tokens=[3, 4]), stream=True)
    assert r.status_code == 200  # the headers went out with the first chunk
    chunks = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    err = json.loads(chunks[-2])["error"]
    assert (err["code"], err["type"], err["message"]) == ("kv_transfer", "engine_error", MISLEADING)
    assert json.loads(chunks[0])["choices"][0]["text"] == "de"  # the tokens before the failure still arrived


def test_a_finished_request_is_a_200_with_its_finish_reason():
    r, front = post([TokenEvent("x", [1, 2], 0), TokenEvent("x", [3], 2, FinishReason.LENGTH)])
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
    assert r.json()["choices"][0]["text"] == "bcd" and front.finished == ["ok"]
