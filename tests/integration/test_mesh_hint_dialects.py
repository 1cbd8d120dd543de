"""Agent hints in other servers' dialects through a real mesh (tiny model, 1P1D, a front-door worker).

A bad value is a 400 naming the field as the client spelt it; each dialect takes effect (vLLM's
and Dynamo's prefetch serve the next turn from a buffer; SGLang's, Mooncake's and Anthropic's
retention marks the store) and changes no token or logprob (exact, and identical without hints);
SGLang's /close_session ends a session's retention and gives its staged blocks back.
"""
from __future__ import annotations

import uuid

import httpx
import pytest

from tests.integration.exactness import ask, assert_exact
from tests.integration.meshutil import wait_until
from tests.integration.test_mesh_agent_hints import BS, MARKS, STAGED, USED, _block_bytes, _first_turn, _start, _total
from tests.integration.test_mesh_dualpath import Probe

pytestmark = pytest.mark.integration
LONG = 600  # seconds: every mark outlives the module, so the marks' count only grows until a session closes


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    m = _start(tmp_path_factory, "dialects", scheduler={"front-workers": "1", "hint-ttl-s": str(LONG)})
    yield m
    m.stop()


def _vllm(sid: str, prefetch: bool) -> dict:
    edits = [{"type": "prefetch", "block_start": 0}] if prefetch else []
    return {"session_id": sid, "parent_session_id": "orchestrator",
            "cache_control": {"type": "ephemeral", "ttl": LONG}, "context_management": {"edits": edits}}


def _envelope(sid: str, prefetch: bool) -> dict:
    return {"kv_hints": {"protocol_version": 1, "message_id": uuid.uuid4().hex, "actions": [
        {"action_id": "a0", "action_type": "kv.fetch", "action_version": 1, "payload": {"blocks": []}},
        {"action_id": "a1", "action_type": "agent_hint", "action_version": 1, "payload": _vllm(sid, prefetch)}]}}


def _dynamo(sid: str, prefetch: bool) -> dict:
    return {"nvext": {"agent_hints": {"priority": 2, "osl": 40, "speculative_prefill": prefetch},
                      "cache_control": {"type": "ephemeral", "ttl": "10m"}, "agent_context": {"trajectory_id": sid}}}


DIALECTS = {  # name -> (the hints of a turn, given its session and whether it warms the next; stages?)
    "vllm": (lambda sid, pf: {"agent_hint": _vllm(sid, pf)}, True),
    "vllm-kv_hints": (_envelope, True),
    "dynamo": (_dynamo, True),
    "sglang": (lambda sid, pf: {"session_id": sid}, False),
    "mooncake": (lambda sid, pf: {"agent_hints": {"reuse_hint": "keep", "cache_ttl_ms": LONG * 1000}}, False),
    "anthropic": (lambda sid, pf: {"cache_control": {"type": "ephemeral", "ttl": "1h"}}, False),
}


@pytest.mark.parametrize("path, fields, param", [
    ("/v1/completions", {"agent_hint": {"cache_control": {"type": "ephemeral", "ttl": "5m"}}},
     "agent_hint.cache_control.ttl"),
    ("/v1/chat/completions", {"kv_hints": {"actions": [{"action_type": "agent_hint", "payload": {
        "context_management": {"edits": [{"type": "forget"}]}}}]}},
     "kv_hints.actions[0].payload.context_management.edits[0].type"),
    ("/v1/completions", {"nvext": {"cache_control": {"type": "ephemeral", "ttl": "five minutes"}}},
     "nvext.cache_control.ttl"),
    ("/v1/chat/completions", {"session_id": 42}, "session_id"),
    ("/v1/completions", {"agent_hints": {"session_id": "s", "reuse_hint": "keep"}}, "agent_hints.reuse_hint"),
    ("/v1/chat/completions", {"cache_control": {"type": "persistent"}}, "cache_control.type"),
    ("/close_session", None, "session_id"),
])
def test_a_bad_value_is_a_400_naming_the_field_in_the_clients_dialect(mesh, path, fields, param):
    body = {} if fields is None else {"max_tokens": 2, **fields, **(
        {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"})}
    r = httpx.post(mesh.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_each_dialect_takes_effect_and_changes_no_token_or_logprob(mesh, reference, dialect):
    hints, stages = DIALECTS[dialect]
    sid, probe, bb = f"{dialect}-{uuid.uuid4().hex[:6]}", Probe(mesh.url), _block_bytes(mesh)
    marks0, used0 = _total(probe, MARKS), _total(probe, USED)
    p2 = _first_turn(mesh, reference, dialect, None, hints(sid, True))  # exact, and stored for the next turn
    hit_blocks = (len(p2) - 1) // BS
    wait_until(lambda: _total(probe, MARKS) - marks0 >= hit_blocks, f"{dialect}: the turn marked retained")
    if stages:
        wait_until(lambda: _total(probe, STAGED) >= hit_blocks * bb, f"{dialect}: the turn staged for the next")
    hinted = ask(mesh.url, p2, 24, **hints(sid, False))
    assert hinted["usage"]["prompt_tokens_details"]["cached_tokens"] == hit_blocks * BS
    if stages:  # the next turn took its prefix from the buffer (told to the holder after the copy: waited for)
        wait_until(lambda: _total(probe, USED) - used0 >= hit_blocks * bb, f"{dialect}: the staged blocks used")
    assert_exact(hinted, reference, p2, what=f"{dialect}: hinted")
    plain = ask(mesh.url, p2, 24)
    assert plain["choices"][0]["token_ids"] == hinted["choices"][0]["token_ids"]
    assert plain["choices"][0]["logprobs"]["token_logprobs"] == hinted["choices"][0]["logprobs"]["token_logprobs"]
    wait_until(lambda: _total(probe, STAGED) == 0, f"{dialect}: nothing left staged")


def test_sglang_close_session_ends_the_sessions_retention_and_gives_its_staging_back(mesh, reference):
    probe = Probe(mesh.url)
    sid = httpx.post(mesh.url + "/open_session", json={"capacity_of_str_len": 4096}, timeout=30).json()
    assert isinstance(sid, str) and sid
    marks0 = _total(probe, MARKS)
    # an SGLang client's session with our own tool-call hint, which names no session: SGLang's names it
    _first_turn(mesh, reference, "sglang-close", {"expected_tool_duration_ms": 2_500}, {"session_id": sid})
    wait_until(lambda: _total(probe, STAGED) > 0, "the session's next turn staged")
    wait_until(lambda: _total(probe, MARKS) > marks0, "the session's blocks marked retained")
    r = httpx.post(mesh.url + "/close_session", json={"session_id": sid}, timeout=30)
    assert (r.status_code, r.content) == (200, b""), r.text
    # (unclosed, the staging would last a minute and the marks ten)
    wait_until(lambda: _total(probe, STAGED) == 0, "the closed session's staged blocks freed")
    wait_until(lambda: _total(probe, MARKS) <= marks0, "the closed session's retention ended")
