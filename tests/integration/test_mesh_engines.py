"""Engines join and leave a running mesh: new capacity without restarts; a dead engine fails its requests."""
from __future__ import annotations

import concurrent.futures as cf
import json
import signal
import time

import httpx
import pytest

from tests.integration.meshutil import Announcements, complete, tiny_mesh

pytestmark = pytest.mark.integration


def _served(metrics_url: str, name: str) -> float:
    for line in httpx.get(metrics_url, timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def test_added_engines_take_work_without_restart(tmp_path):
    mesh = tiny_mesh(tmp_path)
    mesh.start(timeout=120)
    try:
        mesh.add_node("prefill")
        mesh.add_node("decode")
        with Announcements(mesh) as ann:
            assert ann.wait_for(lambda a: len(a.engines) == 4, 60), ann.engines.keys()
            assert ann.wait_for(lambda a: httpx.get(mesh.url + "/health").json()["prefill_engines"] == 2, 30)
            bodies = [{"prompt": f"spread {i} " * 10, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
                      for i in range(8)]
            with cf.ThreadPoolExecutor(8) as pool:
                results = list(pool.map(lambda b: complete(mesh.url, b), bodies))
            assert all(r.status_code == 200 for r in results)
            engines = dict(ann.engines)
        for eng in engines.values():
            name = "dualpath_prefill_requests_total" if eng.role == "prefill" else "dualpath_decode_tokens_total"
            assert _served(eng.metrics_url, name) > 0, f"{eng.engine} took no work"
    finally:
        mesh.stop()


def test_decode_engine_killed_mid_stream_gives_error_event(tmp_path):
    mesh = tiny_mesh(tmp_path, kv_blocks=80)
    mesh.start(timeout=120)
    try:
        body = {"prompt": "dying engine " * 10, "max_tokens": 3900, "temperature": 0, "ignore_eos": True,
                "stream": True}
        events, t_kill = [], 0.0
        with httpx.stream("POST", mesh.url + "/v1/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if len(events) == 3:
                    mesh.kill(mesh.find("decode-")[0], signal.SIGKILL)
                    t_kill = time.monotonic()
        elapsed = time.monotonic() - t_kill
        assert events[-1] == "[DONE]"
        err = json.loads(events[-2])
        assert "error" in err and "stopped responding" in err["error"]["message"]
        assert elapsed < 10, f"error arrived {elapsed:.1f}s after the kill"
        # the mesh keeps answering health (degraded: no decode engine left)
        assert httpx.get(mesh.url + "/health", timeout=5).status_code == 503
    finally:
        mesh.stop()
