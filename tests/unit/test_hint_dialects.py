"""Agent hints in other servers' dialects (services/scheduler/hint_dialects.py): each maps onto the
scheduler's `Hint` as docs/guides/agent-hints.md's table says, on both endpoints; what has no meaning
here changes nothing; a bad value is a 400 naming the field in the client's own dialect; where
dialects overlap, the documented precedence decides."""
from __future__ import annotations

import json

import pytest

from services.scheduler.hint_dialects import duration_s, request_hint
from services.scheduler.hints import parse_hints
from services.scheduler.protocol import ApiError, ChatRequest, CompletionRequest, decode_body
from shared.messages.front import Hint, Reuse

pytestmark = pytest.mark.unit


def _hint(tp=CompletionRequest, **fields) -> Hint | None:
    base = {"prompt": "hi"} if tp is CompletionRequest else {"messages": [{"role": "user", "content": "hi"}]}
    return request_hint(decode_body(json.dumps({**base, **fields}).encode(), tp))


def _param(**fields) -> str:
    with pytest.raises(ApiError) as err:
        _hint(**fields)
    assert err.value.status == 400, err.value.message
    return err.value.param


VLLM = {"session_id": "worker-7", "parent_session_id": "orchestrator-1",
        "cache_control": {"type": "ephemeral", "ttl": 90, "block_offset": 3},
        "context_management": {"manage_request": True,
                               "edits": [{"type": "prefetch", "block_start": 0, "block_end": 4}]}}


@pytest.mark.parametrize("tp", [CompletionRequest, ChatRequest])
@pytest.mark.parametrize("fields, want", [
    # vLLM's RFC `agent_hint`, at the top level and as a kv_hints action's payload
    ({"agent_hint": VLLM}, Hint(session="worker-7", tool_s=0.0, ttl_s=90.0)),
    ({"kv_hints": {"protocol_version": 1, "message_id": "m1", "actions": [
        {"action_id": "a1", "action_type": "kv.fetch", "action_version": 2, "payload": {"blocks": ["ab"]}},
        {"action_id": "a2", "action_type": "agent_hint", "action_version": 1, "payload": VLLM}]}},
     Hint(session="worker-7", tool_s=0.0, ttl_s=90.0)),
    ({"agent_hint": {"session_id": "s", "cache_control": {"type": "ephemeral"}}}, Hint(session="s", ttl_s=300.0)),
    ({"agent_hint": {"session_id": "s", "context_management": {"edits": [{"type": "offload"}]}}},
     Hint(session="s", reuse=Reuse.MEDIUM)),
    ({"agent_hint": {"session_id": "s", "context_management": {"edits": [{"type": "evict"}]}}},
     Hint(session="s", release=True)),
    # Dynamo's nvext
    ({"nvext": {"agent_hints": {"priority": 5, "strict_priority": 1, "osl": 1024, "speculative_prefill": True},
                "cache_control": {"type": "ephemeral", "ttl": "5m"}, "agent_context": {"trajectory_id": "traj-3"},
                "ignore_eos": True, "annotations": ["x"]}},
     Hint(session="traj-3", tool_s=0.0, ttl_s=300.0)),
    ({"nvext": {"cache_control": {"type": "ephemeral", "ttl": "1h"}}}, Hint(ttl_s=3600.0)),
    ({"nvext": {"agent_hints": {"priority": 9, "osl": 12}}}, Hint()),  # named, but nothing with a meaning here
    # SGLang: a session is kept until it closes
    ({"session_id": "sg-1"}, Hint(session="sg-1", reuse=Reuse.HIGH)),
    # Mooncake's agent_hints (the field name ours has)
    ({"agent_hints": {"reuse_hint": "keep", "cache_ttl_ms": 60_000}}, Hint(ttl_s=60.0, reuse=Reuse.HIGH)),
    ({"agent_hints": {"reuse_hint": "neutral"}}, Hint(reuse=Reuse.LOW)),
    ({"agent_hints": {"reuse_hint": "DISCARD"}}, Hint(reuse=Reuse.NONE)),
    # Anthropic-style cache_control
    ({"cache_control": {"type": "ephemeral"}}, Hint(ttl_s=300.0)),
    ({"cache_control": {"type": "ephemeral", "ttl": "1h"}}, Hint(ttl_s=3600.0)),
])
def test_each_dialect_maps_onto_the_hint(tp, fields, want):
    assert _hint(tp, **fields) == want


def test_what_each_mapped_hint_makes_the_scheduler_do():
    default = 120.0
    vllm = _hint(agent_hint=VLLM)
    assert vllm.prefetch and vllm.retain_s(default) == 90.0  # staged at once for the next turn, kept 90 s
    assert _hint(agent_hint={"context_management": {"edits": [{"type": "offload"}]}}).retain_s(default) == default
    evicted = _hint(agent_hint={"session_id": "s", "context_management": {"edits": [{"type": "prefetch"},
                                                                                   {"type": "evict"}]}})
    assert evicted.release and not evicted.prefetch and evicted.retain_s(default) is None
    assert _hint(session_id="sg").retain_s(default) == default and not _hint(session_id="sg").prefetch
    assert _hint(agent_hints={"reuse_hint": "neutral", "cache_ttl_ms": 9000}).retain_s(default) is None
    assert not _hint(nvext={"agent_hints": {"speculative_prefill": False}}).prefetch


def test_no_dialect_is_no_hint_and_envelopes_without_a_hint_action_are_none():
    assert _hint() is None
    fetch_only = {"protocol_version": "2", "actions": [{"action_type": "kv.fetch", "payload": [1, 2]}]}
    assert _hint(kv_hints=fetch_only) is None
    assert _hint(nvext={"ignore_eos": True}) is None  # nvext's other fields are not hints
    assert _hint(session_id="") is None


def test_our_own_agent_hints_are_read_as_before():
    ours = {"workflow_id": "wf", "agent_id": "a7", "expected_tool_duration_ms": 2500, "cache_ttl_ms": 60_000,
            "reuse_hint": "high", "step_id": 4}
    req = decode_body(json.dumps({"prompt": "hi", "agent_hints": ours}).encode(), CompletionRequest)
    assert request_hint(req) == parse_hints(req.agent_hints) == Hint("wf/a7", 2.5, 60.0, Reuse.HIGH)
    assert _hint(agent_hints={}) == Hint()  # hints that say nothing are still hints, as before
    assert _hint(agent_hints={"reuse_hint": "high"}) == Hint(reuse=Reuse.HIGH)  # only shared keys: our levels too
    assert _hint(agent_hints={"reuse_hint": 0.1, "cache_ttl_ms": 1000}) == Hint(ttl_s=1.0, reuse=Reuse.LOW)


def test_a_mooncake_value_beside_keys_only_ours_has_is_a_400():
    for ours in ({"session_id": "s"}, {"expected_tool_duration_ms": 10}, {"release": True}, {"step_id": 1}):
        assert _param(agent_hints={**ours, "reuse_hint": "keep"}) == "agent_hints.reuse_hint"


@pytest.mark.parametrize("fields, param", [
    ({"agent_hint": {"cache_control": {"type": "persistent"}}}, "agent_hint.cache_control.type"),
    ({"agent_hint": {"cache_control": {"ttl": 7200}}}, "agent_hint.cache_control.ttl"),  # the RFC's limit: an hour
    ({"agent_hint": {"context_management": {"edits": [{"type": "drop"}]}}},
     "agent_hint.context_management.edits[0].type"),
    ({"agent_hint": {"context_management": {"edits": [{"type": "evict"}, {"type": "offload", "block_start": 4,
                                                                          "block_end": 2}]}}},
     "agent_hint.context_management.edits[1].block_end"),
    ({"agent_hint": {"session_id": 7}}, "agent_hint.session_id"),
    ({"kv_hints": {"actions": [{"action_type": "agent_hint", "payload": {}},
                               {"action_type": "agent_hint", "payload": {"cache_control": {"ttl": "5m"}}}]}},
     "kv_hints.actions[1].payload.cache_control.ttl"),
    ({"kv_hints": {"actions": [{"action_type": "agent_hint", "payload": "warm"}]}}, "kv_hints.actions[0].payload"),
    ({"kv_hints": {"actions": [{"payload": {}}]}}, "kv_hints.actions[0].action_type"),
    ({"kv_hints": {"actions": {"a": 1}}}, "kv_hints.actions"),
    ({"nvext": {"cache_control": {"type": "ephemeral", "ttl": "5 minutes"}}}, "nvext.cache_control.ttl"),
    ({"nvext": {"cache_control": {"ttl": "-5m"}}}, "nvext.cache_control.ttl"),
    ({"nvext": {"cache_control": {"ttl": True}}}, "nvext.cache_control.ttl"),
    ({"nvext": {"agent_hints": {"speculative_prefill": "yes"}}}, "nvext.agent_hints.speculative_prefill"),
    ({"nvext": {"agent_hints": {"osl": -1}}}, "nvext.agent_hints.osl"),
    ({"nvext": {"agent_context": {"trajectory_id": ["t"]}}}, "nvext.agent_context.trajectory_id"),
    ({"session_id": 12}, "session_id"),
    ({"session_id": "s" * 257}, "session_id"),
    ({"agent_hints": {"reuse_hint": "sometimes"}}, "agent_hints.reuse_hint"),
    ({"agent_hints": {"reuse_hint": "keep", "cache_ttl_ms": -1}}, "agent_hints.cache_ttl_ms"),
    ({"cache_control": {"type": "ephemeral", "ttl": "2w"}}, "cache_control.ttl"),
    ({"cache_control": {"type": "ephemeral", "ttl": "170h"}}, "cache_control.ttl"),  # past a week
    ({"cache_control": {"type": "persistent"}}, "cache_control.type"),
    ({"cache_control": "ephemeral"}, "cache_control"),
])
def test_a_bad_value_is_a_400_naming_the_field_in_its_own_dialect(fields, param):
    assert _param(**fields) == param


@pytest.mark.parametrize("value, seconds", [(None, 300.0), ("5m", 300.0), ("300s", 300.0), ("1h", 3600.0),
                                            ("1500ms", 1.5), (" 2.5m ", 150.0), ("45", 45.0), (90, 90.0), (0, 0.0)])
def test_durations(value, seconds):
    assert duration_s(value, "x.ttl") == seconds


def test_precedence_ours_then_vllm_then_the_envelope_then_dynamo_then_sglang_then_anthropic():
    every = {"agent_hints": {"session_id": "ours", "cache_ttl_ms": 1000},
             "agent_hint": {"session_id": "vllm", "cache_control": {"ttl": 2}},
             "kv_hints": {"actions": [{"action_type": "agent_hint", "payload": {"session_id": "env",
                                                                                "cache_control": {"ttl": 3}}}]},
             "nvext": {"agent_context": {"trajectory_id": "dyn"}, "cache_control": {"ttl": "4s"}},
             "session_id": "sgl", "cache_control": {"ttl": "5s"}}
    order = ["agent_hints", "agent_hint", "kv_hints", "nvext", "session_id", "cache_control"]
    sessions, ttls = ["ours", "vllm", "env", "dyn", "sgl", ""], [1.0, 2.0, 3.0, 4.0, None, 5.0]
    for i in range(len(order)):
        h = _hint(**{k: every[k] for k in order[i:]})
        assert h.session == next((s for s in sessions[i:] if s), ""), order[i:]
        assert h.ttl_s == next(t for t in ttls[i:] if t is not None), order[i:]


def test_dialects_combine_by_meaning_and_an_overridden_one_is_still_checked():
    h = _hint(agent_hints={"session_id": "s", "expected_tool_duration_ms": 2000}, cache_control={"ttl": "1h"},
              nvext={"agent_hints": {"speculative_prefill": True}})
    assert h == Hint(session="s", tool_s=2.0, ttl_s=3600.0)  # our tool call wins over Dynamo's "now"
    assert _hint(agent_hints={"reuse_hint": "none"}, session_id="sg") == Hint(session="sg", reuse=Reuse.NONE)
    assert _param(agent_hints={"cache_ttl_ms": 5}, cache_control={"ttl": "soon"}) == "cache_control.ttl"


def test_a_later_envelope_action_overrides_an_earlier_one():
    actions = [{"action_type": "agent_hint", "payload": {"session_id": "a", "cache_control": {"ttl": 10}}},
               {"action_type": "kv.agent_hint", "payload": {"cache_control": {"ttl": 20}}}]
    assert _hint(kv_hints={"actions": actions}) == Hint(session="a", ttl_s=20.0)
