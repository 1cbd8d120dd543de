"""Prometheus metrics: one registry per service process, served at `/metrics`.

Conventional names: `*_seconds` histograms, `*_total` counters, plain gauges.
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.requests import Request
from starlette.responses import Response

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """A registry with helpers that prefix every name with `dualpath_`."""

    def __init__(self, service: str):
        self.service = service
        self.registry = CollectorRegistry()

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(f"dualpath_{name}", doc, labels, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(f"dualpath_{name}", doc, labels, registry=self.registry)

    def histogram(self, name: str, doc: str, labels: tuple[str, ...] = (), buckets=LATENCY_BUCKETS) -> Histogram:
        return Histogram(f"dualpath_{name}", doc, labels, registry=self.registry, buckets=buckets)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def endpoint(self, request: Request) -> Response:
        return Response(self.render(), media_type=CONTENT_TYPE_LATEST)
