"""Prompt-token tiers over real requests (tiny model, 1P1D, one front-door worker).

Every request's `usage.prompt_tokens_details.dualpath_tiers` sums to its prompt tokens, and
each load mode puts its hits on its own tier: basic on storage_pe, dualpath-split on
storage_pe and storage_de (exactly the blocks each node's gateway read), the oracle on
engine, a turn after a hinted tool call on buffer. The prefill engine's and the scheduler's
`prompt_tier_tokens_total` grow by exactly the splits the clients saw.
"""
from __future__ import annotations

import re
import uuid
from pathlib import Path

import httpx
import pytest

from tests.integration.exactness import ask, ask_stream, wait_stored
from tests.integration.meshutil import complete, metric_samples, tiny_mesh, wait_until
from tests.integration.test_mesh_agent_hints import STAGED, TOLD, _block_bytes, _first_turn, _total
from tests.integration.test_mesh_dualpath import Probe

pytestmark = pytest.mark.integration
BS = 64
READ = "dualpath_storage_gateway_read_bytes_total"
PE_TIERS = "dualpath_prefill_engine_prompt_tier_tokens_total"
SCHED_TIERS = "dualpath_scheduler_prompt_tier_tokens_total"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    extra = {"scheduler": {"liveness-timeout-s": "2", "front-workers": "1", "prefetch-grace-s": "60"}}
    m = tiny_mesh(tmp_path_factory.mktemp("tiers"), kv_blocks=128, extra=extra)
    m.store_root = Path(m.spec.store)
    m.start(timeout=120)
    yield m
    m.stop()


def _probe(mesh) -> Probe:
    """Counters of the gateways and TMs, the prefill engine ("pe") and the scheduler core."""
    probe = Probe(mesh.url)
    view = httpx.get(mesh.url + "/v1/mesh", timeout=10).json()
    probe.urls.update({("pe", e["node"]): e["metrics_url"] for e in view["engines"] if e.get("role") == "prefill"})
    probe.urls.update({("scheduler", s["instance"]): s["metrics_url"] for s in view["schedulers"]})
    return probe


def _snap(probe: Probe) -> dict:
    """The counters once the core has heard every earlier request end (a worker tells it after its
    client has the answer)."""
    core = next(u for who, u in probe.urls.items() if who[0] == "scheduler")
    name = "dualpath_scheduler_requests_running"
    wait_until(lambda: metric_samples(core, name).get(name) == 0, "no request running")
    return probe.snap()


def _tiers(before: dict, after: dict, who: tuple, name: str) -> dict[str, float]:
    """How much each tier's series of `name` grew between two snapshots, on `who`."""
    out: dict[str, float] = {}
    for key, v in after[who].items():
        m = re.match(rf'^{name}\{{.*tier="(\w+)"', key)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + v - before[who].get(key, 0.0)
    return out


def _split(body: dict) -> dict[str, int]:
    """The request's tiers, checked: they sum to its prompt; what was not computed is `cached_tokens`."""
    use = body["usage"]
    tiers = use["prompt_tokens_details"]["dualpath_tiers"]
    assert set(tiers) == {"computed", "engine", "buffer", "storage_pe", "storage_de"}, tiers
    assert sum(tiers.values()) == use["prompt_tokens"], tiers
    assert use["prompt_tokens"] - tiers["computed"] == use["prompt_tokens_details"]["cached_tokens"], use
    return tiers


def _counted(probe: Probe, before: dict, splits: list[dict]) -> None:
    """The prefill engine counted exactly these splits, and so did the scheduler (its core hears of a
    worker's request when the worker is done with it: waited for)."""
    want = {t: float(sum(s[t] for s in splits)) for t in splits[0]}
    pe = next(who for who in probe.urls if who[0] == "pe")
    assert _tiers(before, probe.snap(), pe, PE_TIERS) == want
    sched = next(who for who in probe.urls if who[0] == "scheduler")
    wait_until(lambda: _tiers(before, probe.snap(), sched, SCHED_TIERS) == want, "the scheduler's tier counters")


def _stored_turn(mesh, reference, tag: str) -> list[int]:
    """A first turn (every prompt token computed); returns the second turn's prompt once the first
    turn's blocks are in the store."""
    p1 = f"[{tag} {uuid.uuid4().hex[:8]}] agent log: " + "read file ok; ran tests, 2 passed; " * 14
    r1 = ask(mesh.url, p1, 70)
    assert _split(r1)["computed"] == r1["usage"]["prompt_tokens"]
    ids = r1["choices"][0]["prompt_token_ids"] + r1["choices"][0]["token_ids"]
    wait_stored(mesh.store_root, reference, ids, (len(ids) - 1) // BS)
    return ids + reference.tokenizer.encode(" tool: done, 3 files changed. " * 4)


@pytest.mark.parametrize("mode", ["basic", "dualpath-split"])
def test_stored_hits_count_on_the_path_that_read_them(mesh, reference, mode):
    prompt = _stored_turn(mesh, reference, mode)
    probe = _probe(mesh)
    pe_node, de_node = "p0", "d1"
    before = _snap(probe)
    body = (ask_stream if mode == "basic" else ask)(mesh.url, prompt, 8, dualpath_mode=mode)
    after = probe.snap()
    split, bb = _split(body), _block_bytes(mesh)
    assert split["storage_pe"] + split["storage_de"] >= 8 * BS
    assert split["engine"] == split["buffer"] == 0
    # what each node's storage NIC read, block for block
    assert Probe.delta(before, after, ("gateway", pe_node), READ) == split["storage_pe"] // BS * bb
    assert Probe.delta(before, after, ("gateway", de_node), READ) == split["storage_de"] // BS * bb
    if mode == "basic":
        assert split["storage_de"] == 0
    else:  # idle queues: the split gives both nodes a share
        assert split["storage_pe"] > 0 and split["storage_de"] > 0
    _counted(probe, before, [split])


def test_the_oracles_hits_count_as_engine_memory(mesh):
    p1 = f"[oracle {uuid.uuid4().hex[:8]}] agent log: " + "step ok; " * 50
    body = {"prompt": p1, "max_tokens": 70, "temperature": 0, "ignore_eos": True, "dualpath_mode": "oracle"}
    r1 = complete(mesh.url, body).json()
    probe = _probe(mesh)
    before = _snap(probe)
    r2 = complete(mesh.url, {**body, "prompt": p1 + r1["choices"][0]["text"] + " tool: done. " * 6,
                             "max_tokens": 8})
    assert r2.status_code == 200, r2.text
    split = _split(r2.json())
    # the scheduler's own index: taken as present, nothing read; at least p1's own 7 full blocks (479 bytes):
    # the block after them holds generated tokens, which a decode and re-encode may not give back as they were
    assert split["engine"] >= 7 * BS
    assert split["buffer"] == split["storage_pe"] == split["storage_de"] == 0
    _counted(probe, before, [split])


def test_a_turn_after_a_hinted_tool_call_counts_its_prefetched_hits_as_buffer(mesh, reference):
    sid = f"s-{uuid.uuid4().hex[:6]}"
    probe = _probe(mesh)
    told0 = _total(probe, TOLD)
    p2 = _first_turn(mesh, reference, "tiers-hinted", {"session_id": sid, "expected_tool_duration_ms": 400})
    hit_blocks = (len(p2) - 1) // BS
    wait_until(lambda: _total(probe, STAGED) >= hit_blocks * _block_bytes(mesh), "the prefix staged in a buffer")
    wait_until(lambda: _total(probe, TOLD) - told0 >= hit_blocks, "the staged slots told to the scheduler")
    before = _snap(probe)
    body = ask(mesh.url, p2, 8, agent_hints={"session_id": sid, "cache_ttl_ms": 60_000})
    split = _split(body)
    assert split["buffer"] == hit_blocks * BS and split["storage_pe"] == split["storage_de"] == 0
    _counted(probe, before, [split])
