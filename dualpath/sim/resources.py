"""Links as fluid FIFO servers with two traffic lanes: the cheap bandwidth model behind every transfer.

A reservation starts at max(now, free_at) and lasts bytes / lane bandwidth, O(1) per transfer.
The model lane has 99% of the weight, KV the rest (`kv_slowdown`, `model_slowdown` count both).
"""
from __future__ import annotations

LO_SHARE = 0.01  # the KV lane's arbitration weight: never starved, only what the model leaves


class Link:
    """One direction of a NIC, or a node's DRAM."""

    __slots__ = ("name", "bw", "lo", "free_at", "busy", "bytes", "kv_time", "hi", "hi_since",
                 "hi_bytes", "hi_ideal", "hi_time")

    def __init__(self, name: str, bw: float) -> None:
        if bw <= 0:
            raise ValueError(f"link {name}: bandwidth must be > 0, got {bw}")
        self.name = name
        self.bw = bw
        self.lo = 1.0  # the share of bw KV gets now
        self.free_at = 0.0
        self.busy = 0.0  # seconds of KV transfer time booked, at the full line rate
        self.bytes = 0.0  # KV bytes
        self.kv_time = 0.0  # seconds KV transfers actually took (>= busy when the model shares the link)
        self.hi = 0.0  # the model lane's utilisation now
        self.hi_since = 0.0
        self.hi_bytes = 0.0  # model bytes carried
        self.hi_ideal = 0.0  # seconds the model's bursts would take alone
        self.hi_time = 0.0  # seconds they took beside KV

    def reserve(self, now: float, nbytes: float) -> float:
        """Book `nbytes` of KV from `now` (FIFO); returns when they are through."""
        dt = nbytes / (self.bw * self.lo)
        start = self.free_at if self.free_at > now else now
        self.free_at = start + dt
        self.busy += nbytes / self.bw
        self.kv_time += dt
        self.bytes += nbytes
        return self.free_at

    def set_model(self, now: float, hi: float) -> None:
        """The model lane runs at utilisation `hi` from `now` on (0 = no model traffic)."""
        if hi == self.hi:
            return
        if self.hi:
            self.hi_bytes += self.hi * self.bw * (now - self.hi_since)
        self.hi = hi
        self.hi_since = now
        self.lo = max(1.0 - hi, LO_SHARE)

    def model_burst(self, now: float, nbytes: float) -> float:
        """Seconds a burst of model traffic takes from `now`: full rate, or 99% while KV is queued here."""
        alone = nbytes / self.bw
        took = alone / (1.0 - LO_SHARE) if self.free_at > now else alone
        self.hi_ideal += alone
        self.hi_time += took
        return took

    def utilisation(self, span: float) -> float:
        return self.busy / span if span > 0 else 0.0

    def finish(self, now: float) -> None:
        self.set_model(now, 0.0)


def transfer(now: float, legs: list[tuple[Link, float]]) -> float:
    """Reserve every (link, bytes) leg from `now`; returns the end of the slowest."""
    end = now
    for link, nbytes in legs:
        if nbytes > 0:
            t = link.reserve(now, nbytes)
            if t > end:
                end = t
    return end
