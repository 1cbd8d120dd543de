"""The data plane: how bulk KV bytes move between traffic-managers (never over NATS).

Public API: `create_endpoint`, the Endpoint/Peer contract and descriptors (base.py),
`ShmRegion` (shm_region.py) and the typed errors (errors.py).
"""

from .base import Endpoint, EndpointDesc, Op, Peer, RegionDesc, TrafficClass
from .errors import (
    AuthFailed,
    BackendUnavailable,
    OutOfBounds,
    PeerGone,
    RegionNotFound,
    RemoteError,
    TransferTimeout,
    TransportError,
)
from .registry import create_endpoint
from .shm_region import ShmRegion, new_name

__all__ = [
    "AuthFailed", "BackendUnavailable", "Endpoint", "EndpointDesc", "Op", "OutOfBounds", "Peer", "PeerGone",
    "RegionDesc", "RegionNotFound", "RemoteError", "ShmRegion", "TrafficClass", "TransferTimeout",
    "TransportError", "create_endpoint", "new_name",
]
