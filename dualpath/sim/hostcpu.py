"""The KV path's CPU taken from a node's engine: a mesh whose storage path shares its host's cores.

On a real cluster a node's storage path (storage NIC reads and writes, the copies they
cause) runs on the SNIC's DMA and on cores the engines do not use, which is what the
simulator models by default. A mesh on one small host has no such cores: its storage
gateways and traffic managers take their CPU from the cores the engines compute on. With
`SimConfig.kv_cpu_s_per_byte` = c > 0, every byte a node's storage NIC has moved (read or
written, `moved`) costs c seconds of that node's engine: a prefill step stretches by c times
the bytes its node moved while it ran, a running decode batch stands still for c times the
bytes moved since its last event. Bytes moved while the node's engine is idle cost nothing
(the cores were free). The probe behind c: dualpath/bench/kvcpu.py.

The engines share the host's cores with each other and with the rest of the mesh too:
with `SimConfig.host_cores` = H > 0 (every engine on one host) and the rest of the mesh's
processes keeping `background_cores` = b busy, while E engines compute at once each runs
at H / (E + b) of its own speed when that is below 1 (`HostPool.slow` is the inverse): a
prefill step planned then lasts that much longer, a decode batch steps that much slower
until the count changes.
"""
from __future__ import annotations

from dualpath.sim.resources import Link

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
    """The host's cores shared by its busy engines and the rest of the mesh."""

    __slots__ = ("cores", "background")

    def __init__(self, cores: float, background: float = 0.0) -> None:
        self.cores = cores
        self.background = background

    def slow(self, busy_engines: int) -> float:
        """How much longer an engine's compute takes while `busy_engines` compute at once (>= 1)."""
        want = busy_engines + self.background
        return want / self.cores if want > self.cores else 1.0
