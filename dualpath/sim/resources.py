"""Links as fluid FIFO servers with two traffic lanes: the cheap bandwidth model behind every transfer.

A Link has a bandwidth and a virtual clock `free_at`. Reserving n bytes of KV at time t
starts at max(t, free_at) and holds the link for n / (the KV lane's bandwidth) seconds,
so a saturated link's backlog grows and its throughput is capped, in O(1) per transfer.
A transfer over several links (a pipelined, chunked copy) ends when its slowest hop ends.

Compute NICs also carry the model's own collectives (EP dispatch / combine, attention TP
all-reduce), arbitrated as the paper's InfiniBand virtual lanes: the model's lane has 99%
of the weight, KV the rest. The model's traffic is set as a utilisation `hi` (its bytes
over the step that sends them, `set_model`); while it lasts, KV gets what is left,
bw * max(1 - hi, 1%), and the model's own bursts lose at most the KV lane's 1% (they take
1 / 0.99 as long when KV is queued on the link). Both effects are counted: `kv_slowdown`
(KV time over KV time on an idle link) and `model_slowdown`.
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
        """Seconds a burst of `nbytes` of model traffic takes from `now`: at the full rate, or
        at the model lane's 99% while KV is queued here."""
        alone = nbytes / self.bw
        took = alone / (1.0 - LO_SHARE) if self.free_at > now else alone
        self.hi_ideal += alone
        self.hi_time += took
        return took

    def utilisation(self, span: float) -> float:
        return self.busy / span if span > 0 else 0.0

    def finish(self, now: float) -> None:
        """Close the model lane's books at the end of a run."""
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
