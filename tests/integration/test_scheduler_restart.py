"""A scheduler killed mid-request: after its restart the journal lets it cancel the orphaned work,
so the engines free that request's KV; the mesh serves again."""
from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from tests.integration.meshutil import Announcements, tiny_mesh

pytestmark = pytest.mark.integration


def test_restarted_scheduler_frees_what_its_predecessor_left_running(tmp_path):
    extra = {"scheduler": {"liveness-timeout-s": "2"}}
    mesh = tiny_mesh(tmp_path, kv_blocks=80, extra=extra)
    mesh.start(timeout=120)
    try:
        with Announcements(mesh) as ann:
            idle = lambda a: len(a.engines) == 2 and all(  # noqa: E731
                e.seq == 0 and e.free_blocks == e.total_blocks for e in a.engines.values())
            assert ann.wait_for(idle, 10)
            body = {"prompt": "orphan " * 30, "max_tokens": 3800, "temperature": 0, "ignore_eos": True,
                    "stream": True}

            def client():
                try:
                    with httpx.stream("POST", mesh.url + "/v1/completions", json=body, timeout=30) as r:
                        for _ in r.iter_lines():
                            pass
                except httpx.HTTPError:
                    pass  # the scheduler died under it

            t = threading.Thread(target=client, daemon=True)
            t.start()
            busy = lambda a: any(e.role == "decode" and e.seq > 0 for e in a.engines.values())  # noqa: E731
            assert ann.wait_for(busy, 10)
            sched = mesh.find("scheduler")[0]
            de_proc = mesh.find("decode-")[0]
            # the decode engine holds still while no scheduler runs, so the orphan cannot reach its end
            # however long the restart takes on a loaded machine; then it keeps generating for nobody
            de_proc.popen.send_signal(signal.SIGSTOP)
            try:
                mesh.kill(sched, signal.SIGKILL)
                mesh.restart(sched)
                assert _answers(mesh.url), "the restarted scheduler never answered HTTP"
            finally:
                de_proc.popen.send_signal(signal.SIGCONT)
            t.join(40)
            # the new scheduler reads the journal and cancels the orphan: both engines free everything
            assert ann.wait_for(idle, 30), {e: (a.seq, a.free_blocks) for e, a in ann.engines.items()}
            de = next(e for e in ann.engines.values() if e.role == "decode")
            decoded = next(float(line.split()[-1]) for line in httpx.get(de.metrics_url, timeout=5).text.splitlines()
                           if line.startswith("dualpath_decode_engine_tokens_total "))
            assert decoded < 3799, "the orphan ran to its end: nothing cancelled it"
        r = httpx.post(mesh.url + "/v1/completions", json={"prompt": "after", "max_tokens": 4, "temperature": 0},
                       timeout=30)
        assert r.status_code == 200, r.text
        log = next(p for p in mesh.procs if p.name == "scheduler").log.read_text()
        assert "left unfinished by a previous scheduler" in log
    finally:
        mesh.stop()


def _answers(url: str, tries: int = 600) -> bool:
    """The scheduler's HTTP front answers at all (any status: a decode engine may be held still)."""
    for _ in range(tries):
        try:
            httpx.get(url + "/health", timeout=1)
            return True
        except httpx.HTTPError:
            threading.Event().wait(0.1)  # the process is still starting: poll again
    return False
