"""What the traffic manager's unit tests share: a buffer pool over a fresh shared-memory region, and
a reply that keeps what it was answered."""
from __future__ import annotations

from services.traffic_manager.pool import BufferPool
from shared.messages.registry import KVRegion
from shared.metrics import Metrics
from shared.transport.shm_region import ShmRegion, new_name


def buffer_pool(prefix: str, region_bytes: int, kv: KVRegion) -> tuple[ShmRegion, BufferPool, Metrics]:
    """A region (close it after the test), a pool over it with `kv` attached, and the metrics it counts in."""
    region = ShmRegion.create(new_name(prefix), region_bytes)
    m = Metrics("traffic_manager")
    pool = BufferPool(region, wait_s=0.2, m_free=m.gauge("buffer_free_bytes", "free"))
    pool.attach(kv)
    return region, pool, m


class Reply:
    def __init__(self):
        self.msg = None

    async def respond(self, msg):
        self.msg = msg
