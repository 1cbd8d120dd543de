"""Per-request state an engine keeps while it holds a request (no torch, no I/O)."""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from opentelemetry import context as otel_context

from shared.messages.work import Sampling


@dataclass
class EngineRequest:
    req_id: str
    prompt: list[int]
    sampling: Sampling
    reply: str
    ctx: otel_context.Context
    arrived: float = field(default_factory=time.monotonic)
    blocks: list[int] = field(default_factory=list)  # KV blocks held in this engine
    generated: list[int] = field(default_factory=list)
    cancelled: bool = False
    connection: object = None  # the bus's Losses.current() when it arrived: done once that connection dropped

    @property
    def tokens(self) -> int:
        return len(self.prompt) + len(self.generated)


def stop_ids(sampling: Sampling, eos_ids: tuple[int, ...]) -> set[int]:
    ids = set(sampling.stop_token_ids)
    if not sampling.ignore_eos:
        ids.update(eos_ids)
    return ids


def generator_seed(sampling: Sampling, step: int) -> int | None:
    """Per-step seed so a seeded request samples identically wherever each step runs."""
    if sampling.seed is None:
        return None
    return (sampling.seed * 1_000_003 + sampling.step0 + step) & 0x7FFF_FFFF_FFFF_FFFF


class RecentSet:
    """Request ids seen recently (bounded by count and age): cancels that overtook their work."""

    def __init__(self, max_items: int = 4096, ttl_s: float = 300.0):
        self.max_items, self.ttl_s = max_items, ttl_s
        self._items: OrderedDict[str, float] = OrderedDict()

    def add(self, key: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._items[key] = now
        self._items.move_to_end(key)
        while len(self._items) > self.max_items or (self._items and now - next(iter(self._items.values())) > self.ttl_s):
            self._items.popitem(last=False)

    def __contains__(self, key: str) -> bool:
        seen = self._items.get(key)
        return seen is not None and time.monotonic() - seen <= self.ttl_s
