"""A front-door worker's judgements on engine output (services/scheduler/events.py, worker.py)."""
import pytest

from services.scheduler.events import Router
from services.scheduler.inflight import InFlight
from services.scheduler.worker import running_without
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.stream import StepEvents, TokenEvent
from shared.messages.work import Sampling

pytestmark = pytest.mark.unit


def router(rec: InFlight, resumes: list):
    firsts = []
    r = Router({rec.req_id: rec}, lambda rec, ev, source: resumes.append((ev.code, source)) or True,
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
