"""Prometheus metrics: one registry per service process, served at `/metrics`."""
from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.requests import Request
from starlette.responses import Response

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """Names every series `dualpath_<service>_<name>` (`shared=True`: `dualpath_<name>`)."""

    def __init__(self, service: str):
        self.service = service
        self.registry = CollectorRegistry()

    def full_name(self, name: str, shared: bool = False) -> str:
        return f"dualpath_{name}" if shared else f"dualpath_{self.service}_{name}"

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = (), *, shared: bool = False) -> Counter:
        return Counter(self.full_name(name, shared), doc, labels, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = (), *, shared: bool = False) -> Gauge:
        return Gauge(self.full_name(name, shared), doc, labels, registry=self.registry)

    def histogram(self, name: str, doc: str, labels: tuple[str, ...] = (), buckets=LATENCY_BUCKETS, *,
                  shared: bool = False) -> Histogram:
        return Histogram(self.full_name(name, shared), doc, labels, registry=self.registry, buckets=buckets)

    def live_gauge(self, name: str, doc: str, labels: tuple[str, ...],
                   read: Callable[[], Iterable[tuple[tuple[str, ...], float]]], *, counter: bool = False) -> None:
        """A series read from `read()` ((label values, value) pairs) at scrape time."""
        self.registry.register(_Read(self.full_name(name), doc, labels, read, counter))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def endpoint(self, request: Request) -> Response:
        return Response(self.render(), media_type=CONTENT_TYPE_LATEST)


class _Read:
    def __init__(self, name: str, doc: str, labels: tuple[str, ...], read, counter: bool):
        self.name, self.doc, self.labels, self.read, self.counter = name, doc, labels, read, counter

    def describe(self):
        return [self._family()]

    def collect(self):
        fam = self._family()
        for values, v in self.read():
            fam.add_metric(list(values), v)
        return [fam]

    def _family(self):
        kind = CounterMetricFamily if self.counter else GaugeMetricFamily
        return kind(self.name.removesuffix("_total") if self.counter else self.name, self.doc, labels=self.labels)
