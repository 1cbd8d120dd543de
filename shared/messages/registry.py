"""Announcements: every service publishes one on `{ns}.hb` at start and then as a heartbeat."""
from __future__ import annotations

import msgspec

from shared.messages.storage_gateway import StoreLayout


class Base(msgspec.Struct, tag_field="kind", omit_defaults=True, gc=False):
    instance: str  # unique per process (uuid)
    node: str  # host/node name the process serves
    metrics_url: str = ""  # where its /metrics is served
    pid: int = 0
    leaving: bool = False  # sent once on clean shutdown: drop me now


class KVRegion(msgspec.Struct, omit_defaults=True, gc=False):
    """How an engine's paged KV memory is laid out, so its TM can address blocks."""

    shm_name: str  # POSIX shm segment holding (num_blocks, n_layers, 2, block_size, kv_heads, head_dim)
    num_blocks: int
    block_size: int  # tokens per block
    n_layers: int
    block_nbytes: int  # one Full Block payload (all layers)
    layer_block_nbytes: int  # one Layer Block


class EngineAnnounce(Base, tag="engine"):
    engine: str = ""  # engine id (also its TM's key)
    role: str = "prefill"  # prefill | decode
    group: str = ""  # engine group; its leader talks to the scheduler
    model_id: str = ""
    max_context: int = 0
    seq: int = 0  # requests assigned and not finished (seq_e)
    tok: int = 0  # tokens of those requests (tok_e)
    free_blocks: int = 0
    total_blocks: int = 0
    kv: KVRegion | None = None
    store: StoreLayout | None = None  # how this engine's blocks are named and sized in the store


class TrafficManagerAnnounce(Base, tag="traffic_manager"):
    engine: str = ""  # the engine this TM serves
    endpoint: bytes = b""  # msgpack-encoded transport EndpointDesc
    buffer_bytes: int = 0
    buffer_free_bytes: int = 0
    ready: bool = False  # attached to its engine's KV memory
    prefetch_bytes: int = 0  # buffer bytes holding prefetched blocks (agent sessions)
    prefetch_room_bytes: int = 0  # what a new prefetch may take now (its budget, within the spare slots)
    shm_host: str = ""  # its endpoint's host id when same-host processes may map its buffer (shm), else ""


class StorageGatewayAnnounce(Base, tag="storage_gateway"):
    read_q_blocks: int = 0
    read_q_bytes: int = 0
    store_root: str = ""
    read_bytes_per_s: float = 0.0  # the storage NIC's read rate when capped (0 = uncapped): queue wait = bytes / rate


class SchedulerAnnounce(Base, tag="scheduler"):
    http_url: str = ""
    queued: int = 0


Announce = EngineAnnounce | TrafficManagerAnnounce | StorageGatewayAnnounce | SchedulerAnnounce
decoder = msgspec.msgpack.Decoder(Announce)
