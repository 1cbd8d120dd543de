"""The mesh outlives its NATS server: kill -9 it, restart it on the same port, and every
service reconnects; a request caught by the outage ends in an error, never a hang."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.integration.meshutil import complete, tiny_mesh, wait_until
from tests.integration.natsutil import NatsServer

pytestmark = pytest.mark.integration

SERVICES = 7  # scheduler, 2 gateways, prefill + decode engine, 2 traffic-managers
BODY = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}


def _snapshot(url: str) -> list[dict]:
    snap = httpx.get(url + "/v1/mesh", timeout=5).json()
    return [row for table in ("engines", "traffic_managers", "gateways", "schedulers") for row in snap[table]]


def _counter(metrics_url: str, name: str) -> float:
    for line in httpx.get(metrics_url, timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _stream_into_outage(url: str, server: NatsServer) -> list[str]:
    """Start a long streamed completion and kill NATS the moment the scheduler has accepted it
    (response headers in): every token must cross NATS, so it cannot complete. (Killing at the
    first token is no test with the tiny model: it decodes all 3,900 tokens before the first
    SSE event is out.) Returns every SSE payload; a stream silent for 30 s fails (a hang)."""
    body = {"prompt": "outage " * 10, "max_tokens": 3900, "temperature": 0, "ignore_eos": True, "stream": True}
    events = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        server.kill()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    return events


def test_mesh_survives_a_nats_restart_and_fails_the_request_caught_in_it(tmp_path):
    server = NatsServer(tmp_path).start()
    mesh = tiny_mesh(tmp_path, nats_url=server.url, kv_blocks=80,
                     extra={"scheduler": {"liveness-timeout-s": "2", "assign-timeout-s": "5"}})
    try:
        mesh.start(timeout=120)
        assert complete(mesh.url, {"prompt": "before the outage", **BODY}, timeout=30).status_code == 200
        assert len(_snapshot(mesh.url)) == SERVICES

        # a request in flight when NATS dies ends with an SSE error event, not a hang
        events = _stream_into_outage(mesh.url, server)
        assert events[-1] == "[DONE]"
        err = json.loads(events[-2])
        assert "error" in err, events[-3:]
        assert "no engine" in err["error"]["message"] or "stopped responding" in err["error"]["message"], err
        assert err["error"]["code"] in ("no_engine", "engine_failed"), err

        # a request sent while NATS is down gets a JSON 5xx, not a hang (30 s: the hang guard)
        r = complete(mesh.url, {"prompt": "during the outage", **BODY}, timeout=30)
        assert r.status_code >= 500 and "error" in r.json(), r.text

        server.start()  # the same port: every client reconnects to the URL it knows
        restarted = time.monotonic()

        def everyone_heard_since():  # a heartbeat from every process has reached the scheduler
            since = time.monotonic() - restarted
            rows = _snapshot(mesh.url)
            return len(rows) == SERVICES and all(row["age_s"] < since for row in rows)

        wait_until(everyone_heard_since, "a heartbeat from every service after the restart", 60)
        wait_until(lambda: _healthy(mesh.url), "/health to answer 200 after the restart", 60)
        r = complete(mesh.url, {"prompt": "after the restart", **BODY}, timeout=30)
        assert r.status_code == 200, r.text

        # no request was assigned twice: the PE prefilled the one before and the one after once
        # each; the one caught by the outage at most once (its PrefillWork, if the scheduler had
        # sent it, may only arrive when the bus reconnects, followed by its Cancel, and whether the
        # PE still counts it is a race); the one sent while NATS was down never reached an engine
        pe = [row for row in _snapshot(mesh.url) if row.get("role") == "prefill"]
        assert 2 <= _counter(pe[0]["metrics_url"], "dualpath_prefill_engine_requests_total") <= 3
    finally:
        mesh.stop()
        server.stop()


def test_a_request_whose_connection_drops_fails_at_once_not_at_its_timeout(tmp_path):
    """A responder that took the request and never answers, then NATS dies: the reply cannot come,
    so the request fails with the connection's loss instead of waiting out its 600 s timeout."""
    import asyncio

    from shared.bus import Bus, BusError
    from shared.messages.endpoints import EP
    from shared.messages.subjects import Subjects
    from shared.messages.traffic_manager import Reserve

    server = NatsServer(tmp_path).start()
    subject = Subjects("t").at(EP.TM_RESERVE, engine="silent")

    async def scenario() -> str:
        taken = asyncio.Event()
        responder = await Bus.connect(server.url, "silent-responder")
        caller = await Bus.connect(server.url, "caller")

        async def take(msg, d) -> None:
            taken.set()  # and never respond

        try:
            await responder.subscribe(subject, take)
            took = asyncio.ensure_future(taken.wait())
            while True:  # a loaded server may answer "no responders" just after the subscribe: ask again
                await responder.nc.flush()
                asking = asyncio.ensure_future(caller.request(subject, Reserve("r", 1), timeout=600))
                await asyncio.wait([asking, took], return_when=asyncio.FIRST_COMPLETED)
                if not asking.done():
                    break  # taken, its reply never coming
                if "no responders" not in str(asking.exception()):
                    return f"answered before the responder took it: {asking.exception() or asking.result()}"
            server.kill()
            await asking
        except BusError as exc:
            return exc.reason
        finally:
            for bus in (caller, responder):
                await bus.nc.close()
        return "answered"

    try:
        assert "lost" in asyncio.run(scenario())
    finally:
        server.stop()
