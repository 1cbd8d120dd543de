"""An OTLP/HTTP trace receiver inside the test process: collects every exported span."""
from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict
    links: tuple[str, ...] = ()  # span ids this span links to
    start_ns: int = 0
    end_ns: int = 0


class OtlpReceiver:
    def __init__(self):
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver._collect(ExportTraceServiceRequest.FromString(body))
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _collect(self, req: ExportTraceServiceRequest) -> None:
        for rs in req.resource_spans:
            service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    attrs = {a.key: _value(a.value) for a in s.attributes}
                    with self._lock:
                        links = tuple(link.span_id.hex() for link in s.links)
                        self.spans.append(Span(service, s.name, s.trace_id.hex(), s.span_id.hex(),
                                               s.parent_span_id.hex(), attrs, links, s.start_time_unix_nano,
                                               s.end_time_unix_nano))

    def __enter__(self) -> "OtlpReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None
