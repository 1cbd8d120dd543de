"""A request's life ends everywhere when its client leaves or its decode engine dies.

One tiny mesh, real processes. Its liveness timeout is long (60 s): a request that ends here
ended because the mesh saw what happened (a client gone, an engine restarted, no event for the
stall timeout of 5 s), not because a heartbeat went missing. Each test waits for the condition it needs; the clients' read
timeouts are hang guards only.
"""
from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.integration.meshutil import Announcements, metric_samples, tiny_mesh, wait_until

pytestmark = pytest.mark.integration

LONG = {"prompt": "a long generation " * 20, "max_tokens": 3000, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    m = tiny_mesh(tmp_path_factory.mktemp("life"), kv_blocks=96,
                  extra={"scheduler": {"liveness-timeout-s": "60", "stall-timeout-s": "5"}})
    m.start(timeout=120)
    yield m
    m.stop()


def _sched(mesh) -> dict[str, float]:
    return metric_samples(mesh.url + "/metrics", r"dualpath_scheduler_\w+")


def _decoded(ann: Announcements) -> float:
    de = next(e for e in ann.engines.values() if e.role == "decode")
    return metric_samples(de.metrics_url, "dualpath_decode_engine_tokens_total").get(
        "dualpath_decode_engine_tokens_total", 0.0)


def _idle(mesh) -> dict:
    """/health once no request is queued or running (and the engines hold nothing)."""
    return wait_until(lambda: (h := httpx.get(mesh.url + "/health", timeout=10).json())["running"] == 0
                      and h["queued"] == 0 and h, "no request running")


def _settled(ann: Announcements, start: dict[str, int], since: float) -> bool:
    fresh = {h[1]: (h[2], h[3]) for h in ann.history if h[0] > since}
    return {e: f for e, (_, f) in fresh.items()} == start and all(seq == 0 for seq, _ in fresh.values())


def _cut(ann: Announcements) -> tuple[dict[str, int], float]:
    assert ann.wait_for(lambda a: len(a.engines) == 2 and all(
        e.seq == 0 and e.free_blocks == e.total_blocks for e in a.engines.values()), 30)
    return ann.free_blocks(), _decoded(ann)


def _stream_with_fault(mesh, prompt: list[int], n: int, fault) -> list[str]:
    """Every SSE payload of a greedy streamed completion of `n` tokens; `fault()` runs after the third."""
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
    events = []
    with httpx.stream("POST", mesh.url + "/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 3:
                    fault()
    return events


def test_a_streamed_client_that_leaves_is_cancelled_counted_and_not_running(mesh):
    before = _sched(mesh).get('dualpath_scheduler_requests_total{status="cancelled"}', 0.0)
    with Announcements(mesh) as ann:
        start, decoded0 = _cut(ann)
        with httpx.stream("POST", mesh.url + "/v1/completions", json={**LONG, "stream": True}, timeout=60) as r:
            lines = r.iter_lines()
            seen = 0
            for line in lines:
                seen += line.startswith("data: ")
                if seen >= 3:
                    break
            lines.close()  # the client leaves mid-stream
            t_left = time.monotonic()
        assert ann.wait_for(lambda a: _settled(a, start, t_left), 60), "the engines kept the request"
        assert _decoded(ann) - decoded0 < 2999
    health = _idle(mesh)
    assert health["states"] == {"queued": 0, "prefilling": 0, "decoding": 0, "resuming": 0}
    got = wait_until(lambda: (m := _sched(mesh))['dualpath_scheduler_requests_total{status="cancelled"}'] > before
                     and m, "the cancelled request counted")
    assert got["dualpath_scheduler_requests_running"] == 0


def test_a_non_streamed_client_that_leaves_is_cancelled_on_the_engines(mesh):
    body = json.dumps(LONG).encode()
    host, port = mesh.url.removeprefix("http://").split(":")
    with Announcements(mesh) as ann:
        start, decoded0 = _cut(ann)
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            wait_until(lambda: _decoded(ann) - decoded0 >= 3, "the decode engine decoding the request")
        t_left = time.monotonic()  # the connection is closed: the client left
        assert ann.wait_for(lambda a: _settled(a, start, t_left), 60), "the engines kept the request"
        decoded = _decoded(ann) - decoded0
    assert 3 <= decoded < 2999, f"generation was not cut short ({decoded} tokens)"
    _idle(mesh)


def test_a_decode_engine_killed_mid_stream_and_restarted_resumes_the_stream_exactly(mesh, reference):
    """SIGKILL of the decode engine after the first tokens, restarted at once under the same id
    (as `dualpath up` does): the restart is noticed on its first announcement, the request resumes
    on it, and the client gets every token once, equal to the single-process reference."""
    from shared.model.reference import generate

    prompt = reference.tokenizer.encode("the restarted decode engine " * 6)
    want = generate(reference, prompt, 200, ignore_eos=True)
    de = mesh.find("decode")[0]
    def fault() -> None:
        mesh.kill(de)
        mesh.restart(de, "restarted by the test")

    events = _stream_with_fault(mesh, prompt, 200, fault)
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    assert events[-1] == "[DONE]" and not any("error" in c for c in chunks), chunks[-2:]
    assert chunks[-1]["token_ids"] == want
    _idle(mesh)
    r = httpx.post(mesh.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0,
                                                       "ignore_eos": True, "return_token_ids": True}, timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == want[:8]


def test_a_decode_traffic_manager_killed_and_restarted_leaves_every_later_answer_exact(mesh, reference):
    """The prefill side's data-plane connection to the decode TM reached the dead process's
    buffer after its restart (every later push went where no one read it: wrong tokens, no
    error). The connection is made again for the new process."""
    from shared.model.reference import generate

    prompt = reference.tokenizer.encode("after the traffic manager came back " * 6)
    want = generate(reference, prompt, 16, ignore_eos=True)
    body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    assert httpx.post(mesh.url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["token_ids"] == want
    tm = next(p for p in mesh.procs if p.name.startswith("tm-d"))
    mesh.kill(tm)
    mesh.restart(tm, "restarted by the test")
    wait_until(lambda: (h := httpx.get(mesh.url + "/health", timeout=10).json())["status"] == "ok"
               and h["decode_engines"] == 1 and h, "the decode engine assignable again")
    for _ in range(3):  # whichever path the prompt's hits take
        r = httpx.post(mesh.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == want


def test_a_frozen_decode_engine_is_left_at_the_stall_deadline_and_the_stream_resumes_exactly(mesh, reference):
    """SIGSTOP of the decode engine mid-stream: its heartbeat stops, but the liveness timeout is a
    minute; the request's stall deadline (5 s without an event) resumes it, on the same engine
    once it runs again (SIGCONT when the resume shows), and every token arrives once."""
    import signal

    from shared.model.reference import generate

    prompt = reference.tokenizer.encode("a frozen decode engine " * 6)
    want = generate(reference, prompt, 300, ignore_eos=True)
    de = mesh.find("decode")[0]
    before = _sched(mesh).get("dualpath_scheduler_request_resumes_total", 0.0)
    frozen = []

    def fault() -> None:
        de.popen.send_signal(signal.SIGSTOP)
        frozen.append(de)
        wait_until(lambda: _sched(mesh).get("dualpath_scheduler_request_resumes_total", 0.0) > before,
                   "the stalled request resumed", timeout=60)
        de.popen.send_signal(signal.SIGCONT)
        frozen.pop()

    try:
        events = _stream_with_fault(mesh, prompt, 300, fault)
    finally:
        if frozen:
            de.popen.send_signal(signal.SIGCONT)
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    assert events[-1] == "[DONE]" and not any("error" in c for c in chunks), chunks[-2:]
    assert chunks[-1]["token_ids"] == want
    _idle(mesh)
