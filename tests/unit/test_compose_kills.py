"""The kill column of `make compose-check` (deploy/compose/kills.py), without Docker: which kinds
it covers, how a stream's end is judged and reported, and the client reading a stream."""
from __future__ import annotations

import http.server
import json
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "deploy" / "compose"))

import check  # noqa: E402
import kills  # noqa: E402
from checks import CheckFailed  # noqa: E402
from lifecycle import StreamEnding, StreamInFlight  # noqa: E402

from dualpath.bench.chaos import KINDS  # noqa: E402

pytestmark = pytest.mark.unit

REF = StreamEnding(text="abc", token_ids=(1, 2, 3))
BY_KIND = {t.kind: t for t in kills.TARGETS}


def test_the_column_has_every_kind_of_the_mesh_matrix_once():
    assert [t.kind for t in kills.TARGETS] == list(dict.fromkeys(t.kind for t in kills.TARGETS))
    assert set(BY_KIND) == set(KINDS)


def test_every_mesh_service_of_the_compose_file_is_killed_and_each_engine_container_its_traffic_manager():
    yaml = pytest.importorskip("yaml")
    services = yaml.safe_load((ROOT / "deploy" / "compose" / "docker-compose.yml").read_text())["services"]
    third_party = {"jaeger", "prometheus", "grafana"}  # no dualpath process in them
    assert {t.service for t in kills.TARGETS} == set(services) - third_party
    engines = [s for s, spec in services.items() if spec.get("entrypoint") == ["dualpath-engine-entry"]]
    assert sorted(engines) == ["decode-engine", "prefill-engine"]
    for engine in engines:
        assert {t.process for t in kills.TARGETS if t.service == engine} == {engine, "traffic-manager"}
    assert "dualpath service traffic-manager" in (ROOT / "deploy" / "compose" / "engine-entry.sh").read_text()


@pytest.mark.parametrize(("end", "want"), [
    (StreamEnding(text="abc", token_ids=(1, 2, 3)), "exact"),
    (StreamEnding(text="abd", token_ids=(1, 2, 4)), "wrong (3 tokens, want 3; 1 differ)"),
    (StreamEnding(text="abcc", token_ids=(1, 2, 3, 3)), "wrong (4 tokens, want 3; 0 differ)"),
    (StreamEnding(text="ab", error="decode engine de-1 left"), "error event (decode engine de-1 left)"),
    (StreamEnding(text="ab", lost="RemoteProtocolError: peer closed"),
     "lost connection (RemoteProtocolError: peer closed)"),
    (StreamEnding(text="ab", hung=True), "hung"),
    (StreamEnding(text="ab"), "cut short (no last chunk, 2 characters, no error)"),
])
def test_a_streams_end_is_judged_against_the_reference(end, want):
    assert kills.outcome(end, REF) == want


def test_a_dropped_connection_passes_only_for_the_process_that_held_it():
    lost = "lost connection (ReadError: )"
    assert kills.acceptable(lost, BY_KIND["scheduler"])
    assert not any(kills.acceptable(lost, t) for t in kills.TARGETS if t.kind != "scheduler")
    for t in kills.TARGETS:
        assert kills.acceptable("exact", t) and kills.acceptable("error event (x)", t)
        assert not any(kills.acceptable(o, t) for o in ("hung", "wrong (1 differ)", "cut short (...)", "not finished"))


def test_one_line_per_kind_with_the_outcome_and_the_seconds():
    r = kills.KillResult(BY_KIND["tm-d"], "exact", True, end_s=2.04, restart_s=41.26, serve_s=43.0, restarts="0->1")
    assert r.line() == ("kill tm-d      (traffic-manager in decode-engine): PASS exact; stream ended 2.0s, "
                        "restarted 41.3s (RestartCount 0->1), serving again 43.0s")
    bad = kills.KillResult(BY_KIND["nats"], "not finished", False, end_s=1.5, failure="kill: not back")
    assert bad.line() == ("kill nats      (main process in nats): FAIL not finished; stream ended 1.5s, "
                          "restarted - (RestartCount ?), serving again -; kill: not back")
    assert kills.figures([r, bad]) == {
        "tm-d": {"service": "decode-engine", "process": "traffic-manager", "outcome": "exact", "passed": True,
                 "end_s": 2.0, "restart_s": 41.3, "serve_s": 43.0, "restarts": "0->1"},
        "nats": {"service": "nats", "process": "pid1", "outcome": "not finished", "passed": False,
                 "end_s": 1.5, "restart_s": -1.0, "serve_s": -1.0, "restarts": ""}}


def test_the_check_records_the_column_in_its_figures_and_fails_after_the_rest(monkeypatch):
    ok = kills.KillResult(BY_KIND["prefill"], "exact", True, 1.0, 30.0, 31.0, "0->1")
    bad = kills.KillResult(BY_KIND["gateway-d"], "hung", False, 330.0)
    monkeypatch.setattr(kills, "kill_column", lambda stack, log: [ok, bad])
    run = check.Run(check.argparse.Namespace())
    assert run.kill_column(stack=None) == ["gateway-d"]
    assert run.results == [ok.line()]
    assert set(run.figures["kill_column"]) == {"prefill", "gateway-d"} and run.figures["kill_column_s"] >= 0
    with pytest.raises(CheckFailed, match="failed for gateway-d"):
        check._expect_no_failed_kill(["gateway-d"])
    check._expect_no_failed_kill([])


# -- the client side: a local server streams what the scheduler would -------------------------

def _chunk(payload: dict) -> bytes:
    data = f"data: {json.dumps(payload)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class _Sse(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script: list[dict] = []  # the chunks to send
    cut = False  # True: close the connection without the chunked body's end

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for payload in self.script:
            self.wfile.write(_chunk(payload))
        if not self.cut:
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def sse():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _text(t: str) -> dict:
    return {"choices": [{"text": t, "index": 0}]}


@pytest.mark.parametrize(("script", "cut", "want"), [
    ([_text("a"), _text("bc"), {"choices": [], "usage": {"completion_tokens": 3}, "token_ids": [1, 2, 3]}], False,
     "exact"),
    ([_text("a"), {"error": {"message": "decode engine de-1 failed", "code": "engine_failed"}}], False,
     "error event (decode engine de-1 failed)"),
    ([_text("a")], True, "lost connection (RemoteProtocolError"),
    ([_text("a")], False, "cut short (no last chunk, 1 characters, no error)"),
])
def test_the_stream_in_flight_reads_how_the_stream_ended(sse, monkeypatch, script, cut, want):
    server, url = sse
    monkeypatch.setattr(_Sse, "script", script)
    monkeypatch.setattr(_Sse, "cut", cut)
    end = StreamInFlight(url).ending(60)
    assert kills.outcome(end, REF).startswith(want)
    assert end.at > 0
