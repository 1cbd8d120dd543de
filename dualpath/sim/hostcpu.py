"""The KV path's CPU taken from a node's engine: a mesh whose storage path shares its host's cores.

With `kv_cpu_s_per_byte` = c, each byte a node's storage NIC moves costs its busy engine c
seconds; with `host_cores` = H, E busy engines and b background cores each run at H / (E + b),
and no faster than the probed co-run slowdown of its kind while another engine computes.
"""
from __future__ import annotations

from dualpath.sim.resources import Link

PREFILL, DECODE = "prefill", "decode"  # engine kinds, each with its co-run slowdown
EPS_S = 1e-9  # a charge below this is dropped (ends the stretch of a step: c * rate < 1 converges)


def moved(link: Link, now: float) -> float:
    """KV bytes a FIFO link has carried by `now`: those booked, less the backlog still queued."""
    left = link.free_at - now
    return link.bytes - (left * link.bw * link.lo if left > 0 else 0.0)


class KvCpu:
    """Per node, the storage bytes already charged; `take` returns the CPU seconds owed since."""

    __slots__ = ("c", "mark")

    def __init__(self, c_s_per_byte: float) -> None:
        self.c = c_s_per_byte
        self.mark: dict[int, float] = {}  # node id -> bytes moved when last taken

    def take(self, nid: int, r: Link, w: Link, now: float) -> float:
        """CPU seconds the node's storage path used since the last take (and mark `now`)."""
        total = moved(r, now) + moved(w, now)
        before = self.mark.get(nid, 0.0)
        self.mark[nid] = total
        owed = self.c * (total - before)
        return owed if owed > EPS_S else 0.0


class HostPool:
    """The host's cores shared by its busy engines and the rest of the mesh.

    Time-slicing alone misses what engines computing at once cost each other on one host (shared
    caches, memory bandwidth, sibling threads, wake-ups): `corun` is that slowdown per engine kind,
    measured by the bench's probe (dualpath/bench/corun.py); 1.0 = none known."""

    __slots__ = ("cores", "background", "corun")

    def __init__(self, cores: float, background: float = 0.0, corun_prefill: float = 1.0,
                 corun_decode: float = 1.0) -> None:
        self.cores = cores
        self.background = background
        self.corun = {PREFILL: corun_prefill, DECODE: corun_decode}

    def slow(self, busy_engines: int, kind: str = DECODE) -> float:
        """How much longer a `kind` engine's compute takes while `busy_engines` compute at once (>= 1)."""
        want = busy_engines + self.background
        sliced = want / self.cores if want > self.cores else 1.0
        together = self.corun[kind] if busy_engines > 1 else 1.0
        return together if together > sliced else sliced
