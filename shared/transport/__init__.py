"""The data plane: how bulk KV bytes move between traffic-managers (never over NATS)."""

from .base import Endpoint, EndpointDesc, Op, Peer, RegionDesc, TrafficClass
from .errors import (
    AuthFailed,
    BackendUnavailable,
    NotGranted,
    OutOfBounds,
    PeerGone,
    RegionNotFound,
    RemoteError,
    TransferTimeout,
    TransportError,
)
from .grants import Grant, decode_grant, encode_grant
from .registry import create_endpoint
from .shm_region import ShmRegion, new_name

__all__ = [
    "AuthFailed", "BackendUnavailable", "Endpoint", "EndpointDesc", "Grant", "NotGranted", "Op", "OutOfBounds",
    "Peer", "PeerGone",
    "RegionDesc", "RegionNotFound", "RemoteError", "ShmRegion", "TrafficClass", "TransferTimeout",
    "TransportError", "create_endpoint", "decode_grant", "encode_grant", "new_name",
]
