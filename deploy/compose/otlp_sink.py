#!/usr/bin/env python
"""A minimal OTLP/HTTP trace receiver that keeps every span and shows them as JSON.

Stands in for Jaeger in docker-compose.local.yml: POST /v1/traces keeps an export's spans,
GET /spans lists them, GET /health answers 200.
"""
from __future__ import annotations

import argparse
import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else None


def spans_of(req: ExportTraceServiceRequest) -> list[dict]:
    out = []
    for rs in req.resource_spans:
        service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append({"service": service, "name": s.name, "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(), "parent_id": s.parent_span_id.hex(),
                            "attributes": {a.key: _value(a.value) for a in s.attributes},
                            "links": [link.span_id.hex() for link in s.links]})
    return out


class Sink:
    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.lock = threading.Lock()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):  # noqa: N802 - http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/traces":
                    return self._answer(404, b'{"error": "only /v1/traces"}', "application/json")
                try:
                    if self.headers.get("Content-Encoding") == "gzip":
                        body = gzip.decompress(body)
                    spans = spans_of(ExportTraceServiceRequest.FromString(body))
                except Exception as exc:  # a bad export is the sender's problem: 400, keep serving
                    msg = json.dumps({"error": f"not an OTLP trace export: {exc}"}).encode()
                    return self._answer(400, msg, "application/json")
                with sink.lock:
                    sink.spans.extend(spans)
                self._answer(200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")

            def do_GET(self):  # noqa: N802
                if self.path == "/spans":
                    with sink.lock:
                        body = json.dumps(sink.spans).encode()
                    return self._answer(200, body, "application/json")
                if self.path == "/health":
                    return self._answer(200, b"ok", "text/plain")
                self._answer(404, b'{"error": "GET /spans or /health"}', "application/json")

            def log_message(self, *args):
                pass

        return Handler


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="otlp_sink.py", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=4318)
    args = ap.parse_args(argv)
    server = ThreadingHTTPServer((args.host, args.port), Sink().handler())
    print(f"otlp_sink: listening on {args.host}:{server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
