"""What every endpoint has locally: regions, copy worker, liveness marker, announcement."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from .aio import deadline
from .base import EndpointDesc, Op, RegionDesc, TrafficClass, coalesce, host_id
from .classes import DEFAULT_WEIGHTS
from .copier import CopyWorker
from .grants import Grant, GrantTable
from .regions import RegionTable
from .shm_region import ShmRegion, new_name


class Liveness:
    """A one-page shm segment whose byte 0 says whether its endpoint is open."""

    def __init__(self) -> None:
        self.region = ShmRegion.create(new_name("alive"), 4096)
        self.region.buf[0] = 1

    @property
    def name(self) -> str:
        return self.region.name

    def close(self) -> None:
        self.region.buf[0] = 0
        self.region.unlink()
        self.region.close()


class LocalSide:
    backend = "local"

    def __init__(self, node: str, weights: Sequence[int] = DEFAULT_WEIGHTS, timeout: float | None = None) -> None:
        self.node = node
        self.weights = tuple(weights)
        self.timeout = timeout
        self.regions = RegionTable()
        self.grants = GrantTable()
        self.copier = CopyWorker(self.weights, name=f"dp-copy-{node}")
        self.liveness = Liveness()
        self.host_id = host_id()
        self._closed = False

    def register(self, name: str, buf: memoryview, *, shm_name: str = "", remote: bool = True) -> RegionDesc:
        return self.regions.add(name, buf, shm_name=shm_name, remote=remote)

    def unregister(self, name: str) -> None:
        self.regions.drop(name)

    def grant(self, region: str, ranges: Iterable[tuple[int, int]] | None = None, *, read: bool = True,
              write: bool = True) -> Grant:
        view = self.regions.remote_view(region)
        return self.grants.add(region, len(view), view, ranges, read, write)

    def revoke(self, grant: Grant) -> bool:
        """False if `grant` was not live."""
        return self.grants.revoke(grant.token)

    def base_desc(self, **extra: object) -> EndpointDesc:
        return EndpointDesc(
            backend=self.backend, node=self.node, host_id=self.host_id, pid=os.getpid(),
            regions=self.regions.remote_descs(), alive=self.liveness.name, **extra,  # type: ignore[arg-type]
        )

    async def copy_local(self, ops: list[Op], cls: TrafficClass, *, timeout: float | None = None) -> None:
        pairs = [
            (self.regions.resolve(o.remote_region, o.remote_offset, o.length),
             self.regions.resolve(o.local_region, o.local_offset, o.length))
            for o in coalesce(ops)
        ]
        async with deadline(timeout if timeout is not None else self.timeout, self.node, _nbytes(ops)):
            await self.copier.copy(pairs, int(cls))

    def close_local(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.liveness.close()
        self.copier.close()
        self.regions.clear()
        self.grants.clear()


def _nbytes(ops: list[Op]) -> int:
    return sum(o.length for o in ops)
