"""Engines join and leave a running mesh: new capacity without restarts; a dead engine fails its requests."""
from __future__ import annotations

import concurrent.futures as cf
import json
import signal
import time

import httpx
import pytest

from tests.integration.meshutil import Announcements, complete, tiny_mesh, wait_until

pytestmark = pytest.mark.integration


_WORK = {"prefill": "dualpath_prefill_engine_requests_total", "decode": "dualpath_decode_engine_tokens_total"}


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
            wait_until(lambda: (h := httpx.get(mesh.url + "/health", timeout=10).json())["prefill_engines"] == 2
                       and h["decode_engines"] == 2, "both new engines to be assignable")
            engines = dict(ann.engines)

            def idle() -> list[str]:
                return [e.engine for e in engines.values() if _served(e.metrics_url, _WORK[e.role]) == 0]

            # overlapping requests, arriving a little apart (as agents do): every pull sees a fresh load.
            # Which PE group pulls first rotates per dispatch tick, so a few in a row may land on one
            # engine: past the first 8, requests go on (up to 32) only while an engine has no work yet
            with cf.ThreadPoolExecutor(8) as pool:
                futures = []
                for i in range(32):
                    if i >= 8 and not idle():
                        break
                    body = {"prompt": f"spread {i} " * 10, "max_tokens": 400, "temperature": 0, "ignore_eos": True}
                    futures.append(pool.submit(complete, mesh.url, body))
                    time.sleep(0.05)  # the arrival pattern, not a wait for anything
                results = [f.result() for f in futures]
            assert all(r.status_code == 200 for r in results)
        assert idle() == [], f"took no work from {len(results)} requests"
    finally:
        mesh.stop()


def _stream_and_kill(mesh, body, victim_prefix, after=3):
    """Stream `body`; SIGKILL the first process named `victim_prefix` after `after` events.
    Returns every SSE payload; a stream silent for 60 s fails (a hang)."""
    events = []
    with httpx.stream("POST", mesh.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == after:
                mesh.kill(mesh.find(victim_prefix)[0], signal.SIGKILL)
    return events


def test_killed_decode_engine_with_no_spare_fails_the_stream_cleanly(tmp_path):
    extra = {"scheduler": {"liveness-timeout-s": "2", "assign-timeout-s": "4"}}
    mesh = tiny_mesh(tmp_path, kv_blocks=80, extra=extra)
    mesh.start(timeout=120)
    try:
        body = {"prompt": "dying engine " * 10, "max_tokens": 3900, "temperature": 0, "ignore_eos": True}
        events = _stream_and_kill(mesh, body, "decode-")
        assert events[-1] == "[DONE]"
        err = json.loads(events[-2])
        assert "error" in err and "no engine" in err["error"]["message"]
        assert (err["error"]["code"], err["error"]["type"]) == ("no_engine", "service_unavailable")
        assert httpx.get(mesh.url + "/health", timeout=5).status_code == 503  # degraded, still answering
    finally:
        mesh.stop()


def test_request_on_a_hung_prefill_engine_resumes_on_a_new_one(tmp_path):
    import concurrent.futures as cf

    import torch

    from shared.model.loader import load_model
    from shared.model.reference import generate

    extra = {"scheduler": {"liveness-timeout-s": "2"}}
    mesh = tiny_mesh(tmp_path, extra=extra)
    mesh.start(timeout=120)
    try:
        torch.set_num_threads(1)
        ref = load_model("tiny", seed=0)
        prompt = ref.tokenizer.encode("hung prefill " * 20)
        pe = mesh.find("prefill-")[0]
        pe.popen.send_signal(signal.SIGSTOP)  # hangs: no heartbeat, no answer
        body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
        with cf.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(complete, mesh.url, body, "/v1/completions", 90)
            wait_until(lambda: _served(mesh.url + "/metrics", "dualpath_scheduler_requests_running") == 1,
                       "the request to be assigned (to the hung engine)")
            mesh.add_node("prefill")  # capacity arrives; the scheduler drops the silent engine
            r = pending.result()
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["token_ids"] == generate(ref, prompt, 12, ignore_eos=True)
        assert "dualpath_scheduler_request_resumes_total 1.0" in httpx.get(mesh.url + "/metrics", timeout=5).text
    finally:
        mesh.kill(pe, signal.SIGKILL)
        mesh.stop()
