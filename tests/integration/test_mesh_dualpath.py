"""The two read paths: dualpath (split across PE and DE storage NICs), basic (PE only), oracle (no I/O).

Greedy tokens are identical for dualpath and basic and equal to a run with an empty
store; each mode moves bytes only where it should (checked on the services' metrics).
"""
from __future__ import annotations

import re
import time
import uuid

import httpx
import pytest

from tests.integration.meshutil import complete, tiny_mesh

pytestmark = pytest.mark.integration


def _counters(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url, timeout=10).text.splitlines():
        m = re.match(r"^(dualpath_\w+_total)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


class Probe:
    """Byte counters of both gateways and both traffic-managers, before/after a request."""

    def __init__(self, url: str):
        mesh = httpx.get(url + "/v1/mesh", timeout=10).json()
        self.urls = {("gateway", g["node"]): g["metrics_url"] for g in mesh["gateways"]}
        self.urls.update({("tm", t["engine"]): t["metrics_url"] for t in mesh["traffic_managers"]})

    def snap(self) -> dict:
        return {k: _counters(u) for k, u in self.urls.items()}

    @staticmethod
    def delta(a: dict, b: dict, who: tuple, name: str) -> float:
        return sum(v - a[who].get(k, 0.0) for k, v in b[who].items() if k.startswith(name))


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    m = tiny_mesh(tmp_path_factory.mktemp("dp"), kv_blocks=128)
    m.start(timeout=120)
    yield m
    m.stop()


def _two_turns(mesh, mode: str):
    p1 = f"[{mode} {uuid.uuid4().hex[:8]}] agent log: " + "step ok; " * 50
    r1 = complete(mesh.url, {"prompt": p1, "max_tokens": 70, "temperature": 0, "ignore_eos": True,
                             "dualpath_mode": mode}).json()
    time.sleep(0.6)  # persistence is background work
    p2 = p1 + r1["choices"][0]["text"] + " tool: done. " * 6
    probe = Probe(mesh.url)
    before = probe.snap()
    r2 = complete(mesh.url, {"prompt": p2, "max_tokens": 16, "temperature": 0, "ignore_eos": True,
                             "return_token_ids": True, "dualpath_mode": mode})
    assert r2.status_code == 200, r2.text
    return r2.json(), probe, before, probe.snap()


@pytest.mark.parametrize("mode", ["dualpath", "basic"])
def test_second_turn_is_exact_on_every_path(mesh, reference, mode):
    from shared.model.reference import generate

    body, probe, before, after = _two_turns(mesh, mode)
    cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 8 * 64
    want = generate(reference, body["choices"][0]["prompt_token_ids"], 16, ignore_eos=True)
    assert body["choices"][0]["token_ids"] == want
    pe_read = probe.delta(before, after, ("gateway", "p0"), "dualpath_storage_read_bytes_total")
    de_read = probe.delta(before, after, ("gateway", "d1"), "dualpath_storage_read_bytes_total")
    pulled = probe.delta(before, after, ("tm", "p0-e0"), 'dualpath_tm_bytes_total{kind="de_path_pull"}')
    if mode == "basic":
        assert pe_read > 0 and de_read == 0 and pulled == 0
    else:  # idle queues: the hit blocks are split across both storage NICs
        assert pe_read > 0 and de_read > 0 and pulled == de_read


def test_oracle_moves_no_kv_bytes(mesh):
    body, probe, before, after = _two_turns(mesh, "oracle")
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= 8 * 64  # hits as if stored
    for who in probe.urls:
        assert probe.delta(before, after, who, "dualpath_storage_read_bytes_total") == 0
        assert probe.delta(before, after, who, "dualpath_tm_bytes_total") == 0


def test_unknown_mode_is_rejected(mesh):
    r = complete(mesh.url, {"prompt": "x", "max_tokens": 2, "dualpath_mode": "fastest"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dualpath_mode"


def _de_buffer_free(url: str) -> float:
    mesh = httpx.get(url + "/v1/mesh", timeout=10).json()
    tm = next(t for t in mesh["traffic_managers"] if t["node"] == "d1")
    for line in httpx.get(tm["metrics_url"], timeout=10).text.splitlines():
        if line.startswith("dualpath_tm_buffer_free_bytes "):
            return float(line.split()[1])
    raise AssertionError("no tm_buffer_free_bytes gauge")


def _settled(url: str, timeout: float = 10.0) -> float:
    """The DE buffer's free bytes once they stop changing (persistence writes are background)."""
    last, deadline = -1.0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = _de_buffer_free(url)
        if now == last:
            return now
        last = now
        time.sleep(0.5)
    return last


def test_staged_slots_are_freed_when_the_prompt_finishes_at_prefill(mesh):
    """A DE-path request whose only token comes from prefill never reaches the decode
    engine: the DE buffer slots its hits were staged in must still be freed."""
    p1 = f"[one-token {uuid.uuid4().hex[:8]}] agent log: " + "step ok; " * 50
    r1 = complete(mesh.url, {"prompt": p1, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert r1.status_code == 200, r1.text
    idle = _settled(mesh.url)
    probe = Probe(mesh.url)
    before = probe.snap()
    r2 = complete(mesh.url, {"prompt": p1 + r1.json()["choices"][0]["text"], "max_tokens": 1,
                             "dualpath_mode": "dualpath"})
    assert r2.status_code == 200, r2.text
    assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 4 * 64
    staged = probe.delta(before, probe.snap(), ("gateway", "d1"), "dualpath_storage_read_bytes_total")
    assert staged > 0  # some hits really went through the DE buffer
    assert _settled(mesh.url) == idle
