"""The prefill engine's own Prometheus series (prompts, tokens, forwards, hand-offs, queue, states, tiers)."""
from __future__ import annotations

from shared.messages.stream import PromptTiers
from shared.metrics import Metrics
from shared.tiers import NAMES

TAIL_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class PrefillMetrics:
    def __init__(self, m: Metrics, engine: str):
        self.requests = m.counter("requests_total", "Prompts prefilled")
        self.tokens = m.counter("tokens_total", "Prompt tokens computed")
        self.step = m.histogram("step_seconds", "Prefill forward time")
        self.compute = m.counter("compute_seconds", "Forward time not spent waiting for stored KV")
        self.handoff = m.histogram("handoff_seconds", "KV push + admit time")
        self.tail = m.histogram("handoff_tail_seconds", "Last layer computed -> last layer in the DE buffer",
                                buckets=TAIL_BUCKETS)
        self.queue = m.gauge("queue_length", "Requests waiting for prefill (for KV blocks, or queued to compute)")
        self.states = m.gauge("requests_held", "Requests this engine holds, by state (life.py)", ("state",))
        self.illegal = m.counter("illegal_transitions_total", "Request state moves refused as illegal (a bug)")
        tiers = m.counter("prompt_tier_tokens_total", "Prompt tokens prefilled, by where their KV came from "
                          "(computed, engine, buffer, storage_pe, storage_de)", ("engine", "tier"))
        self.tiers = {name: tiers.labels(engine, name) for name in NAMES}  # tier -> this engine's series

    def prefilled(self, tiers: PromptTiers) -> None:
        """One prompt's prefill is over: count it and its tokens by tier."""
        self.requests.inc()
        for name, child in self.tiers.items():
            child.inc(getattr(tiers, name))
