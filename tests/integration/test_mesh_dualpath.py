"""The load modes' bytes: oracle moves none; a DE-path request that ends at prefill frees the
DE-buffer slots its hits were staged in. (Exactness of every read path, and where each
mode's bytes go: test_mesh_exactness.py.)
"""
from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.integration.exactness import wait_stored
from tests.integration.meshutil import complete, metric_samples, tiny_mesh

pytestmark = pytest.mark.integration


def _counters(url: str) -> dict[str, float]:
    return metric_samples(url, r"dualpath_\w+_total")


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
    """Two turns in the oracle mode: nothing is stored or read, the second turn's hits are taken
    as present (the scheduler's own index), so no wait for persistence is needed."""
    p1 = f"[{mode} {uuid.uuid4().hex[:8]}] agent log: " + "step ok; " * 50
    r1 = complete(mesh.url, {"prompt": p1, "max_tokens": 70, "temperature": 0, "ignore_eos": True,
                             "dualpath_mode": mode}).json()
    p2 = p1 + r1["choices"][0]["text"] + " tool: done. " * 6
    probe = Probe(mesh.url)
    before = probe.snap()
    r2 = complete(mesh.url, {"prompt": p2, "max_tokens": 16, "temperature": 0, "ignore_eos": True,
                             "return_token_ids": True, "dualpath_mode": mode})
    assert r2.status_code == 200, r2.text
    return r2.json(), probe, before, probe.snap()


def test_oracle_moves_no_kv_bytes(mesh):
    body, probe, before, after = _two_turns(mesh, "oracle")
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= 8 * 64  # hits as if stored
    for who in probe.urls:
        assert probe.delta(before, after, who, "dualpath_storage_gateway_read_bytes_total") == 0
        assert probe.delta(before, after, who, "dualpath_traffic_manager_bytes_total") == 0


def test_unknown_mode_is_rejected(mesh):
    r = complete(mesh.url, {"prompt": "x", "max_tokens": 2, "dualpath_mode": "fastest"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dualpath_mode"


def _de_buffer(url: str) -> tuple[float, float]:
    """(free, total) bytes of the decode node's TM buffer, from the scheduler's mesh view."""
    mesh = httpx.get(url + "/v1/mesh", timeout=10).json()
    tm = next(t for t in mesh["traffic_managers"] if t["node"] == "d1")
    for line in httpx.get(tm["metrics_url"], timeout=10).text.splitlines():
        if line.startswith("dualpath_traffic_manager_buffer_free_bytes "):
            return float(line.split()[1]), float(tm["buffer_bytes"])
    raise AssertionError("no tm_buffer_free_bytes gauge")


def _wait_buffer_idle(url: str, block_nbytes: int, timeout: float = 60.0) -> None:
    """Wait until every slot of the DE buffer is free (persistence copies are background work)."""
    free, total = _de_buffer(url)
    idle = total - total % block_nbytes
    deadline = time.monotonic() + timeout  # a hang guard only
    while free != idle and time.monotonic() < deadline:
        time.sleep(0.05)
        free, _ = _de_buffer(url)
    assert free == idle, f"DE buffer holds {idle - free:.0f} bytes it should have freed"


def test_staged_slots_are_freed_when_the_prompt_finishes_at_prefill(mesh, reference):
    """A DE-path request whose only token comes from prefill never reaches the decode
    engine: the DE buffer slots its hits were staged in must still be freed."""
    p1 = f"[one-token {uuid.uuid4().hex[:8]}] agent log: " + "step ok; " * 50
    r1 = complete(mesh.url, {"prompt": p1, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                             "return_token_ids": True})
    assert r1.status_code == 200, r1.text
    ids = reference.tokenizer.encode(p1) + r1.json()["choices"][0]["token_ids"]
    wait_stored(Path(mesh.spec.store), reference, ids, (len(ids) - 1) // 64)
    block_nbytes = 64 * reference.config.kv_bytes_per_token
    _wait_buffer_idle(mesh.url, block_nbytes)
    probe = Probe(mesh.url)
    before = probe.snap()
    r2 = complete(mesh.url, {"prompt": p1 + r1.json()["choices"][0]["text"], "max_tokens": 1,
                             "dualpath_mode": "dualpath-split"})
    assert r2.status_code == 200, r2.text
    assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 4 * 64
    staged = probe.delta(before, probe.snap(), ("gateway", "d1"), "dualpath_storage_gateway_read_bytes_total")
    assert staged > 0  # some hits really went through the DE buffer
    _wait_buffer_idle(mesh.url, block_nbytes)
