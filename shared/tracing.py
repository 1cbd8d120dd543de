"""OpenTelemetry set-up and trace-context propagation through NATS headers.

Without an OTLP exporter spans are not recorded, yet each trace id travels and is logged.
"""
from __future__ import annotations

import os
from typing import Mapping

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

_provider: TracerProvider | None = None


def setup_tracing(service: str, instance: str, exporter: SpanExporter | None = None) -> TracerProvider:
    """Install the process-wide provider once; later calls return the same one."""
    global _provider
    if _provider is not None:
        return _provider
    resource = Resource.create({"service.name": service, "service.instance.id": instance})
    if exporter is None and os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    unrecorded = exporter is None and not os.environ.get("OTEL_TRACES_SAMPLER")
    provider = TracerProvider(resource=resource, sampler=ALWAYS_OFF if unrecorded else None)
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _provider = provider
    return provider


def recording() -> bool:
    """Whether spans are recorded; where not, a hot path may skip building one."""
    return _provider is None or _provider.sampler is not ALWAYS_OFF


def shutdown_tracing() -> None:
    if _provider is not None:
        _provider.force_flush(timeout_millis=3000)
        _provider.shutdown()


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def inject_headers(headers: dict[str, str] | None = None, ctx: otel_context.Context | None = None) -> dict[str, str]:
    headers = dict(headers or {})
    propagate.inject(headers, context=ctx)
    return headers


def extract_context(headers: Mapping[str, str] | None) -> otel_context.Context:
    return propagate.extract(dict(headers or {}))


def trace_id_hex(ctx: otel_context.Context | None = None) -> str:
    span = trace.get_current_span(ctx)
    sc = span.get_span_context()
    return format(sc.trace_id, "032x") if sc.is_valid else ""
