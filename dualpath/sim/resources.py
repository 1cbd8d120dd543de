"""Links as fluid FIFO servers: the cheap bandwidth model behind every transfer.

A Link has a bandwidth and a virtual clock `free_at`. Reserving n bytes at time t
starts at max(t, free_at) and holds the link for n / bw seconds, so a saturated link's
backlog grows and its throughput is capped at bw, in O(1) per transfer. A transfer over
several links (a pipelined, chunked copy) ends when its slowest hop ends.
"""
from __future__ import annotations


class Link:
    """One direction of a NIC, or a node's DRAM."""

    __slots__ = ("name", "bw", "free_at", "busy", "bytes")

    def __init__(self, name: str, bw: float) -> None:
        if bw <= 0:
            raise ValueError(f"link {name}: bandwidth must be > 0, got {bw}")
        self.name = name
        self.bw = bw
        self.free_at = 0.0
        self.busy = 0.0  # seconds of transfer time booked
        self.bytes = 0.0

    def reserve(self, now: float, nbytes: float) -> float:
        """Book `nbytes` from `now` (FIFO); returns when they are through."""
        dt = nbytes / self.bw
        start = self.free_at if self.free_at > now else now
        self.free_at = start + dt
        self.busy += dt
        self.bytes += nbytes
        return self.free_at

    def utilisation(self, span: float) -> float:
        return self.busy / span if span > 0 else 0.0


def transfer(now: float, legs: list[tuple[Link, float]]) -> float:
    """Reserve every (link, bytes) leg from `now`; returns the end of the slowest."""
    end = now
    for link, nbytes in legs:
        if nbytes > 0:
            t = link.reserve(now, nbytes)
            if t > end:
                end = t
    return end
