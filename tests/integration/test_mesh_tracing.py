"""One request through the mesh yields ONE trace with spans from every service it passes."""
from __future__ import annotations

import pytest

from tests.integration.meshutil import complete, tiny_mesh, wait_until
from tests.integration.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.integration

# the spans the trace must hold; services export in batches, so the test waits for all of them
WANTED = {("scheduler", "assign"), ("prefill_engine", "prefill_chunk"), ("decode_engine", "decode"),
          ("traffic_manager", "kv_transfer"),  # PE-side TM: the PD transfer
          ("traffic_manager", "kv_reserve"), ("traffic_manager", "kv_h2d")}  # DE-side TM


def _exported(otlp: OtlpReceiver, rid: str) -> bool:
    """Every WANTED span of the request's trace, and the batch span linked to its prefill, are in."""
    roots = [s for s in otlp.spans if s.attributes.get("req_id") == rid and not s.parent_id]
    if not roots:
        return False
    names = {(s.service, s.name) for s in otlp.spans if s.trace_id == roots[0].trace_id}
    chunks = {s.span_id for s in otlp.spans if s.trace_id == roots[0].trace_id and s.name == "prefill_chunk"}
    return names >= WANTED and any(s.name == "prefill_batch" and chunks & set(s.links) for s in otlp.spans)


def test_one_request_one_trace_across_services(tmp_path):
    with OtlpReceiver() as otlp:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        mesh = tiny_mesh(tmp_path, env=env)
        mesh.start(timeout=120)
        try:
            r = complete(mesh.url, {"prompt": "trace me " * 30, "max_tokens": 6, "temperature": 0,
                                    "ignore_eos": True})
            assert r.status_code == 200, r.text
            rid = r.json()["id"]
            wait_until(lambda: _exported(otlp, rid), f"every span of request {rid} at the OTLP receiver", 60)
        finally:
            mesh.stop()
    roots = [s for s in otlp.spans if s.attributes.get("req_id") == rid and not s.parent_id]
    assert len(roots) == 1, roots
    trace_spans = [s for s in otlp.spans if s.trace_id == roots[0].trace_id]
    mine = [s for s in otlp.spans if s.attributes.get("req_id") == rid]
    assert {s.trace_id for s in mine} == {roots[0].trace_id}, "a span of the request left its trace"
    assert {s.service for s in trace_spans} >= {"scheduler", "prefill_engine", "decode_engine", "traffic_manager"}
    names = {(s.service, s.name) for s in trace_spans}
    assert ("traffic_manager", "kv_transfer") in names  # PE-side TM: the PD transfer
    assert ("traffic_manager", "kv_reserve") in names and ("traffic_manager", "kv_h2d") in names  # DE-side TM
    assert ("decode_engine", "decode") in names and ("scheduler", "assign") in names
    assign = next(s for s in trace_spans if s.name == "assign")
    assert assign.attributes["pe"] and assign.attributes["de"] and "read_path" in assign.attributes
    xfer = next(s for s in trace_spans if s.name == "kv_transfer")
    assert xfer.attributes["bytes"] > 0 and xfer.attributes["blocks"] >= 1
    prefill = next(s for s in trace_spans if s.name == "prefill_chunk")
    batch = [s for s in otlp.spans if s.name == "prefill_batch" and prefill.span_id in s.links]
    assert batch, "the batched forward has its own span, linked to the requests it computes"
    ids = {s.span_id for s in trace_spans}
    assert all(s.parent_id in ids for s in trace_spans if s.parent_id), "a span's parent is missing"
