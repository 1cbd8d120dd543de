"""`agent_hints` on the API: the public RFCs' shape is accepted, unknown fields are ignored, bad
values are a 400 naming the field, and the normalised `Hint` says what the scheduler does."""
from __future__ import annotations

import json

import pytest

from services.scheduler.hints import parse_hints
from services.scheduler.protocol import ApiError, ChatRequest, CompletionRequest, decode_body
from shared.messages.front import Hint, Reuse

pytestmark = pytest.mark.unit


def _decode(hints, tp=CompletionRequest):
    body = {"prompt": "hi", "agent_hints": hints} if tp is CompletionRequest else \
        {"messages": [{"role": "user", "content": "hi"}], "agent_hints": hints}
    return parse_hints(decode_body(json.dumps(body).encode(), tp).agent_hints)


@pytest.mark.parametrize("tp", [CompletionRequest, ChatRequest])
def test_the_rfc_shape_is_accepted_and_unknown_fields_are_ignored(tp):
    h = _decode({"workflow_id": "wf", "agent_id": "a7", "step_id": 3, "parent_step_id": "2",
                 "expected_tool_duration_ms": 2500, "cache_ttl_ms": 60_000, "reuse_hint": "high",
                 "some_future_field": {"x": [1, 2]}}, tp)
    assert h == Hint(session="wf/a7", tool_s=2.5, ttl_s=60.0, reuse=Reuse.HIGH)
    assert h.prefetch and h.retain_s(120.0) == 60.0


def test_no_hints_is_none_and_a_session_id_wins_over_workflow_ids():
    assert parse_hints(decode_body(b'{"prompt": "hi"}', CompletionRequest).agent_hints) is None
    assert _decode({"session_id": "s1", "workflow_id": "wf"}).session == "s1"


@pytest.mark.parametrize("hints, field", [
    ({"expected_tool_duration_ms": -1}, "agent_hints.expected_tool_duration_ms"),
    ({"expected_tool_duration_ms": "soon"}, "agent_hints.expected_tool_duration_ms"),
    ({"cache_ttl_ms": 1e12}, "agent_hints.cache_ttl_ms"),
    ({"reuse_hint": "sometimes"}, "agent_hints.reuse_hint"),
    ({"reuse_hint": 1.5}, "agent_hints.reuse_hint"),
    ({"reuse_hint": True}, "agent_hints.reuse_hint"),
    ({"release": "yes"}, "agent_hints.release"),
    ({"session_id": "x" * 257}, "agent_hints.session_id"),
    ("not an object", "agent_hints"),
])
def test_a_bad_value_is_a_400_naming_the_field(hints, field):
    with pytest.raises(ApiError) as err:
        _decode(hints)
    assert (err.value.status, err.value.param) == (400, field), err.value.message


@pytest.mark.parametrize("reuse, level", [("none", Reuse.NONE), ("LOW", Reuse.LOW), ("medium", Reuse.MEDIUM),
                                          (0, Reuse.NONE), (0.2, Reuse.LOW), (0.5, Reuse.MEDIUM), (1, Reuse.HIGH)])
def test_reuse_levels_and_probabilities(reuse, level):
    assert _decode({"reuse_hint": reuse}).reuse == level


def test_what_each_hint_asks_for():
    tool = Hint(tool_s=3.0)
    assert tool.prefetch and tool.retain_s(120.0) == 120.0  # a tool call: retained for the default TTL
    assert Hint(ttl_s=10.0).retain_s(120.0) == 10.0 and not Hint(ttl_s=10.0).prefetch
    assert Hint().retain_s(120.0) is None  # hints naming only a session change nothing
    assert Hint(reuse=Reuse.HIGH).retain_s(120.0) == 120.0
    assert not Hint(tool_s=3.0, reuse=Reuse.NONE).prefetch and Hint(reuse=Reuse.LOW, ttl_s=9).retain_s(120) is None
    released = Hint(session="s", tool_s=3.0, release=True)
    assert not released.prefetch and released.retain_s(120.0) is None
