"""The shm backend: peers on the same host copy straight into each other's segments."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .aio import deadline
from .base import Endpoint, EndpointDesc, Op, Peer, RegionDesc, TrafficClass, coalesce
from .classes import DEFAULT_WEIGHTS
from .copier import CopyWorker, Pair
from .errors import PeerGone, RegionNotFound, TransportError
from .grants import Grant, check_grant
from .local import LocalSide
from .regions import RegionTable, check_bounds
from .shm_region import ShmRegion, process_alive


def shm_reachable(local_host_id: str, remote: EndpointDesc) -> bool:
    return remote.host_id == local_host_id and bool(remote.alive) and all(r.shm for r in remote.regions)


class ShmPeer(Peer):
    """Copies to/from a same-host endpoint's segments; also the "auto" fast path of tcp and verbs."""

    def __init__(self, regions: RegionTable, copier: CopyWorker, remote: EndpointDesc, timeout: float | None) -> None:
        self.name = remote.node
        self._regions = regions
        self._copier = copier
        self._remote = remote
        self._timeout = timeout
        self._maps: dict[str, ShmRegion] = {}
        self._arrays: dict[str, np.ndarray] = {}  # the mapped segments as uint8: sliced per op
        try:
            self._alive = ShmRegion.attach(remote.alive)
        except FileNotFoundError:
            raise PeerGone(self.name, "liveness segment missing") from None
        self._closed = False

    def refresh(self, remote: EndpointDesc) -> None:
        self._remote = remote

    async def write(self, ops: list[Op], cls: TrafficClass, *, timeout: float | None = None,
                    grant: Grant | None = None) -> None:
        check_grant(self.name, grant, ops, True)
        await self._run(self._pairs(coalesce(ops), True), cls, timeout)

    async def read(self, ops: list[Op], cls: TrafficClass, *, timeout: float | None = None,
                   grant: Grant | None = None) -> None:
        check_grant(self.name, grant, ops, False)
        await self._run(self._pairs(coalesce(ops), False), cls, timeout)

    def _pairs(self, ops: list[Op], write: bool) -> list[Pair]:
        """(dst, src) array slices of each op; ops on the first op's regions are sliced inline (hot path)."""
        if not ops:
            return []
        rname, lname = ops[0].remote_region, ops[0].local_region
        ra, la = self._array(rname), self._regions.array(lname)
        rsize, lsize = len(ra), len(la)
        out: list[Pair] = []
        for o in ops:
            r, lo, n = o.remote_offset, o.local_offset, o.length
            if o.remote_region == rname and o.local_region == lname and 0 <= r and 0 <= lo and 0 <= n \
                    and r + n <= rsize and lo + n <= lsize:
                rv, lv = ra[r : r + n], la[lo : lo + n]
            else:  # another region, or out of bounds: the general path (raises the typed error)
                rv, lv = self._view(o), self._regions.resolve_array(o.local_region, lo, n)
            out.append((rv, lv) if write else (lv, rv))
        return out

    async def _run(self, pairs: Sequence[Pair], cls: TrafficClass, timeout: float | None) -> None:
        self._check_alive()
        nbytes = sum(len(d) for d, _ in pairs)
        async with deadline(timeout if timeout is not None else self._timeout, self.name, nbytes):
            await self._copier.copy(pairs, int(cls), nbytes)

    def _check_alive(self) -> None:
        if self._closed:
            raise PeerGone(self.name, "peer closed locally")
        if self._alive.buf[0] != 1:
            raise PeerGone(self.name, "remote endpoint closed")
        if not process_alive(self._remote.pid):
            raise PeerGone(self.name, f"process {self._remote.pid} exited")

    def _array(self, name: str) -> np.ndarray:
        arr = self._arrays.get(name)
        return arr if arr is not None else self._attach(self._remote_desc(name))

    def _view(self, op: Op) -> np.ndarray:
        arr = self._array(op.remote_region)
        check_bounds(op.remote_region, op.remote_offset, op.length, len(arr))
        return arr[op.remote_offset : op.remote_offset + op.length]

    def _remote_desc(self, name: str) -> RegionDesc:
        desc = self._remote.region(name)
        if desc is None or not desc.shm:
            raise RegionNotFound(name, where="remote")
        return desc

    def _attach(self, desc: RegionDesc) -> np.ndarray:
        self._check_alive()
        try:
            seg = ShmRegion.attach(desc.shm)
        except FileNotFoundError:
            raise PeerGone(self.name, f"segment {desc.shm} gone") from None
        self._maps[desc.name] = seg
        arr = self._arrays[desc.name] = np.frombuffer(seg.buf, np.uint8)
        return arr

    async def close(self) -> None:
        self._closed = True
        self._arrays.clear()  # before unmapping: an array holds the mapping's buffer
        for seg in [*self._maps.values(), self._alive]:
            try:
                seg.close()
            except BufferError:  # a view is still referenced: the GC unmaps it later
                pass
        self._maps.clear()


class ShmEndpoint(LocalSide, Endpoint):
    backend = "shm"

    def __init__(self, node: str, weights: Sequence[int] = DEFAULT_WEIGHTS, timeout: float | None = None) -> None:
        super().__init__(node, weights, timeout)
        self._peers: list[ShmPeer] = []

    async def start(self) -> None:
        return None

    def desc(self) -> EndpointDesc:
        return self.base_desc()

    async def connect(self, remote: EndpointDesc) -> Peer:
        if remote.host_id != self.host_id:
            raise TransportError(f"shm backend cannot reach {remote.node!r} on another host")
        peer = ShmPeer(self.regions, self.copier, remote, self.timeout)
        self._peers.append(peer)
        return peer

    async def close(self) -> None:
        for p in self._peers:
            await p.close()
        self.close_local()
