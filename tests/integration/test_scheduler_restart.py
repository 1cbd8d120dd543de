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
            mesh.kill(sched, signal.SIGKILL)  # the decode engine keeps generating for nobody
            mesh.restart(sched)
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
