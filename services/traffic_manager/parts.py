"""The collaborators the traffic-manager's storage paths receive, instead of the service.

Owns only the bundle (`TMParts`); the service builds it once its endpoint is up."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from services.traffic_manager.config import TrafficManagerConfig
from services.traffic_manager.pool import BufferPool
from services.traffic_manager.progress import Registry
from services.traffic_manager.read_queues import ReadQueues
from services.traffic_manager.slot_grants import GrantsGiven, GrantsHeld
from services.traffic_manager.transfers import Transfers
from shared.bus import Bus, Losses
from shared.messages.endpoints import EP
from shared.messages.subjects import Subjects
from shared.metrics import Metrics
from shared.transport.base import Endpoint, Peer

NOT_ATTACHED = "engine KV memory not attached yet"


class PeersGone:
    """Per other TM, resolved when that TM is known gone, so a request to it fails at once."""

    def __init__(self) -> None:
        self._by_engine: dict[str, Losses] = {}

    def future(self, engine: str) -> asyncio.Future:
        return self._by_engine.setdefault(engine, Losses()).current()

    def gone(self, engine: str) -> None:
        losses = self._by_engine.pop(engine, None)
        if losses is not None:
            losses.lost()


@dataclass(frozen=True)
class TMParts:
    cfg: TrafficManagerConfig
    bus: Bus
    subjects: Subjects
    metrics: Metrics
    pool: BufferPool
    endpoint: Endpoint
    peer: Callable[[str], Awaitable[Peer]]  # engine -> a data-plane connection to its traffic-manager
    queues: ReadQueues
    m_bytes: Counter  # dualpath_traffic_manager_bytes_total{kind}
    spawn: Callable[..., asyncio.Task[Any]]  # Service.spawn: supervised tasks
    given: GrantsGiven  # grants of this TM's buffer slots (DE side; prefetch holder)
    held: GrantsHeld  # grants other TMs gave this one (PE side)
    reads: Registry  # (req_id, tag) -> ReadTrack: storage reads in layer groups, as reported
    layers: Registry  # req_id -> LayerState: layers computed by the engine and pushed on
    claim_local: Callable[[str, list[bytes]], list[int]] = lambda owner, keys: []  # prefetched slots here
    drop_local: Callable[[str, str], bool] = lambda owner, why: False  # ... released (prefetch.py)
    xfers: Transfers = field(default_factory=Transfers)  # every transfer's state (transfers.py)
    peers_gone: PeersGone = field(default_factory=PeersGone)  # other TMs known gone: their requests end

    @property
    def group_layers(self) -> int:
        """Layers per group of a storage read (0: whole blocks)."""
        n = self.pool.layout.n_layers if self.pool.layout else 0
        size = -(-n // self.cfg.read_layer_groups) if n else 0
        return size if 0 < size < n else 0

    @property
    def progress_subject(self) -> str:
        return self.subjects.at(EP.TM_READ_PROGRESS, engine=self.cfg.engine)

    @property
    def loaded_subject(self) -> str:
        return self.subjects.at(EP.PE_LOADED, engine=self.cfg.engine)
