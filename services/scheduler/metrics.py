"""The scheduler's own Prometheus series (requests, tokens, latencies, queue, engines, loops)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.scheduler.inflight import InFlight
from shared.metrics import Metrics
from shared.tiers import NAMES

ASSIGN_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.2, 0.5, 1,
                  2, 5, 10, 30)


@dataclass(frozen=True)
class SchedulerMetrics:
    requests: Any
    prompt: Any
    gen: Any
    cached: Any
    tiers: Any
    ttft: Any
    tpot: Any
    queue: Any
    running: Any
    engines: Any
    loop_errors: Any
    resumes: Any
    rounds: Any
    assign_wait: Any
    illegal: Any

    @classmethod
    def register(cls, m: Metrics) -> "SchedulerMetrics":
        return cls(
            requests=m.counter("requests_total", "Requests answered", ("status",)),
            prompt=m.counter("prompt_tokens_total", "Prompt tokens accepted"),
            gen=m.counter("generation_tokens_total", "Tokens generated"),
            cached=m.counter("cached_prompt_tokens_total", "Prompt tokens served from the store"),
            tiers=m.counter("prompt_tier_tokens_total", "Prompt tokens of answered requests by where their KV "
                            "came from, as their usage says (computed, engine, buffer, storage_pe, storage_de)",
                            ("tier",)),
            ttft=m.histogram("time_to_first_token_seconds", "TTFT"),
            tpot=m.histogram("time_per_output_token_seconds", "TPOT",
                             buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2)),
            queue=m.gauge("queue_length", "Requests waiting for an engine"),
            running=m.gauge("requests_running", "Requests placed on engines and not finished (prefilling, decoding, resuming)"),
            engines=m.gauge("engines_live", "Assignable engines", ("role",)),
            loop_errors=m.counter("loop_errors_total", "Exceptions caught in the scheduler's loops", ("loop",)),
            resumes=m.counter("request_resumes_total", "Requests resumed on other engines after a failure"),
            rounds=m.counter("dispatch_rounds_total", "Dispatch rounds run (kicks arriving together share one)"),
            assign_wait=m.histogram("assign_wait_seconds", "From a request's arrival (or resumption) to its work "
                                    "published to a prefill engine", buckets=ASSIGN_BUCKETS),
            illegal=m.counter("illegal_transitions_total", "Request state moves refused as illegal (a bug)"),
        )

    def set_engines(self, prefill: int, decode: int) -> None:
        self.engines.labels("prefill").set(prefill)
        self.engines.labels("decode").set(decode)

    def finished(self, rec: InFlight, status: str) -> None:
        """A request's last event reached its client: its status, tokens and latencies."""
        self.requests.labels(status).inc()
        self.gen.inc(rec.next_index)
        self.cached.inc(rec.cached_tokens)
        if rec.tiers is not None:
            for name in NAMES:
                self.tiers.labels(name).inc(getattr(rec.tiers, name))
        if rec.first_at:
            self.ttft.observe(rec.ttft)
        if rec.next_index > 1:
            self.tpot.observe(rec.tpot)
