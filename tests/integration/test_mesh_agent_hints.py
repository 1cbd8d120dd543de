"""Agent hints through a real mesh (tiny model, 1P1D): a bad hint is a 400 naming the field; a
turn that ends with `expected_tool_duration_ms` has its stored KV prefetched into a buffer, the
next turn is served from that buffer (no storage read for those blocks at arrival) and its
tokens and logprobs are identical to the same prompt without hints and within 1e-4 of the
single-process reference; `release` gives the staged blocks back.

Three meshes: the default transport and policy (idle queues tie: the prefill side stages, the
prefill engine copies from its own traffic-manager's buffer), the same with `read_path=de` (the
decode side stages in a buffer on the prefill engine's host: the engine copies from that buffer
itself, and its push's reservation adopts the blocks as the prompt's first DE-buffer slots, so
only the rest of the prompt is pushed), and tcp with `read_path=de` (no shared memory between
the traffic-managers: the decode engine's traffic-manager adopts the blocks on the fetch's
`Reserve`, the PE's reads them one-sidedly over TCP and pushes only the rest of the prompt).
"""
from __future__ import annotations

import random
import uuid
from pathlib import Path

import httpx
import pytest

from tests.integration.exactness import ask, assert_exact, wait_stored
from tests.integration.meshutil import metric_samples, tiny_mesh, wait_until
from tests.integration.test_mesh_dualpath import Probe

pytestmark = pytest.mark.integration
READ = "dualpath_storage_gateway_read_bytes_total"
BULK = "dualpath_storage_gateway_bulk_read_bytes_total"
USED = 'dualpath_traffic_manager_bytes_total{kind="prefetch_used"}'
STAGED = "dualpath_traffic_manager_prefetch_staged_bytes"
MARKS = "dualpath_storage_gateway_retention_marks"
PUSHED = 'dualpath_traffic_manager_bytes_total{kind="pd_push"}'
TOLD = 'dualpath_scheduler_prefetch_blocks_total{outcome="staged"}'
DIRECT = 'dualpath_prefill_engine_staged_copy_blocks_total{outcome="copied"}'
BS = 64


def _start(tmp_path_factory, name: str, scheduler: dict | None = None, **kw):
    # staged blocks wait a minute past the expected return: a loaded machine's slow turns never see them expire
    extra = {"scheduler": {"liveness-timeout-s": "2", "prefetch-grace-s": "60", **(scheduler or {})}}
    m = tiny_mesh(tmp_path_factory.mktemp(name), kv_blocks=128, extra=extra, **kw)
    m.store_root = Path(m.spec.store)
    m.start(timeout=120)
    return m


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    m = _start(tmp_path_factory, "hints")
    yield m
    m.stop()


@pytest.fixture(scope="module")
def shm_de_mesh(tmp_path_factory):
    m = _start(tmp_path_factory, "hints-shm-de", scheduler={"read-path": "de"})
    yield m
    m.stop()


@pytest.fixture(scope="module")
def de_mesh(tmp_path_factory):
    m = _start(tmp_path_factory, "hints-de", scheduler={"read-path": "de"}, transport="tcp")
    yield m
    m.stop()


def _series(url: str) -> dict[str, float]:
    """Every dualpath_* sample of one /metrics page (gauges too)."""
    return metric_samples(url)


def _of(probe: Probe, who: tuple, name: str) -> float:
    return sum(v for k, v in _series(probe.urls[who]).items() if k.startswith(name))


def _total(probe: Probe, name: str) -> float:
    return sum(_of(probe, who, name) for who in probe.urls)


@pytest.mark.parametrize("hints, field", [
    ({"expected_tool_duration_ms": -5}, "agent_hints.expected_tool_duration_ms"),
    ({"reuse_hint": "often"}, "agent_hints.reuse_hint"),
    ({"cache_ttl_ms": "long"}, "agent_hints.cache_ttl_ms"),
])
def test_a_bad_hint_is_a_400_naming_the_field(mesh, hints, field):
    r = httpx.post(mesh.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "agent_hints": hints},
                   timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


def test_unknown_hint_fields_are_ignored(mesh):
    r = httpx.post(mesh.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "agent_hints": {"session_id": "x", "new_idea": [1, {"a": 2}], "step_id": 4}}, timeout=60)
    assert r.status_code == 200, r.text


def _first_turn(mesh, reference, tag: str, hints: dict | None, fields: dict | None = None) -> list[int]:
    """Turn 1 (checked exact; `hints` as agent_hints, `fields` as they are); returns turn 2's prompt: turn 1's
    ids plus a tool result short enough that turn 2 has no full block turn 1 did not store (so any
    repeat of it loads the same blocks)."""
    words = random.Random(tag).choices(["read", "file", "ok;", "ran", "tests,", "2", "passed;", "diff", "+3", "-1"], k=90)
    p1 = reference.tokenizer.encode(f"[{tag} {uuid.uuid4().hex[:8]}] agent log: " + " ".join(words))
    n1 = 40 + (10 - len(p1) - 40) % BS  # (prompt + generated) ends 10 tokens into a block
    extra = {"agent_hints": hints} if hints else {}
    r1 = ask(mesh.url, p1, n1, **extra, **(fields or {}))
    assert_exact(r1, reference, p1, what=f"{tag}: turn 1")
    ids = p1 + r1["choices"][0]["token_ids"]
    assert len(ids) % BS == 10
    wait_stored(mesh.store_root, reference, ids, (len(ids) - 1) // BS)
    return ids + reference.tokenizer.encode(" tool: ok, 3 files changed.")[:30]


@pytest.mark.parametrize("which, holder, direct", [("mesh", "p0-e0", True), ("shm_de_mesh", "d1-e0", True),
                                                   ("de_mesh", "d1-e0", False)])
def test_a_tool_call_turn_is_served_from_the_prefetch_and_hints_change_no_logprob(request, reference, which,
                                                                                     holder, direct):
    mesh = request.getfixturevalue(which)
    sid = f"s-{uuid.uuid4().hex[:6]}"
    probe = Probe(mesh.url)
    view = httpx.get(mesh.url + "/v1/mesh", timeout=10).json()
    probe.urls.update({("pe", e["engine"]): e["metrics_url"] for e in view["engines"] if e.get("role") == "prefill"})
    probe.urls.update({("scheduler", s["instance"]): s["metrics_url"] for s in view["schedulers"]})
    used0, direct0, told0 = _total(probe, USED), _total(probe, DIRECT), _total(probe, TOLD)
    p2 = _first_turn(mesh, reference, "hinted", {"session_id": sid, "expected_tool_duration_ms": 400})
    hit_blocks = (len(p2) - 1) // BS
    # the prefetch stages the stored prefix in a buffer during the "tool call"
    wait_until(lambda: _total(probe, STAGED) >= hit_blocks * _block_bytes(mesh), "the prefix staged in a buffer")
    assert _of(probe, ("tm", holder), STAGED) > 0, f"staged elsewhere than {holder}"
    # ... and the scheduler heard where (the slots it names in the next turn's assignment)
    wait_until(lambda: _total(probe, TOLD) - told0 >= hit_blocks, "the staged slots told to the scheduler")
    before = probe.snap()
    hinted = ask(mesh.url, p2, 24, agent_hints={"session_id": sid, "cache_ttl_ms": 60_000})
    after = probe.snap()
    assert hinted["usage"]["prompt_tokens_details"]["cached_tokens"] == hit_blocks * BS
    # told to the holder after the copy (off the turn's path), so waited for
    used = wait_until(lambda: _total(probe, USED) - used0 >= hit_blocks * _block_bytes(mesh) and
                      _total(probe, USED) - used0, "the prefetched blocks reported used")
    assert used == hit_blocks * _block_bytes(mesh), "the turn did not take its blocks from the prefetch"
    # in a buffer it can map (its own TM's, the DE's on its host) the PE copies them itself, without
    # asking anyone; elsewhere (tcp only) the TMs move them
    assert _total(probe, DIRECT) - direct0 == (hit_blocks if direct else 0)
    arrival = sum(Probe.delta(before, after, who, READ) for who in before if who[0] == "gateway")
    assert arrival == 0, f"{arrival} bytes read from storage at arrival although every hit was prefetched"
    bb, blocks = _block_bytes(mesh), -(-len(p2) // BS)
    pushed = Probe.delta(before, after, ("tm", "p0-e0"), PUSHED)
    # in the DE's buffer the prefetched blocks were adopted as the prompt's slots (by the fetch's
    # reservation, or the push's once the PE copied them itself): only the rest is pushed
    assert pushed == (blocks - hit_blocks if holder.startswith("d") else blocks) * bb, pushed / bb
    assert_exact(hinted, reference, p2, what="turn 2 served from the prefetch")
    plain = ask(mesh.url, p2, 24)  # the same prompt, no hints: read from storage at arrival
    assert plain["usage"]["prompt_tokens_details"]["cached_tokens"] == hit_blocks * BS
    assert plain["choices"][0]["token_ids"] == hinted["choices"][0]["token_ids"]
    assert plain["choices"][0]["logprobs"]["token_logprobs"] == hinted["choices"][0]["logprobs"]["token_logprobs"]
    wait_until(lambda: _total(probe, STAGED) == 0, "the claimed prefetch released")


def test_release_gives_the_staged_blocks_back_and_ends_the_retention(mesh, reference):
    sid = f"s-{uuid.uuid4().hex[:6]}"
    probe = Probe(mesh.url)
    marks0 = _total(probe, MARKS)
    _first_turn(mesh, reference, "released", {"session_id": sid, "expected_tool_duration_ms": 2_500})
    wait_until(lambda: _total(probe, STAGED) > 0, "the prefix staged in a buffer")
    held = wait_until(lambda: _total(probe, MARKS) - marks0, "the session's blocks marked retained in the store")
    r = httpx.post(mesh.url + "/v1/completions", json={"prompt": "bye", "max_tokens": 1,
                                                      "agent_hints": {"session_id": sid, "release": True}}, timeout=60)
    assert r.status_code == 200, r.text
    wait_until(lambda: _total(probe, STAGED) == 0, "the released session's staged blocks freed")
    wait_until(lambda: _total(probe, MARKS) <= marks0 + held - 8, "the released session's retention ended")


def _block_bytes(mesh) -> int:
    return next(e["kv_block_bytes"] for e in httpx.get(mesh.url + "/v1/mesh", timeout=10).json()["engines"]
                if e.get("kv_block_bytes"))
