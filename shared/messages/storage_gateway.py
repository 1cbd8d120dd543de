"""Storage-gateway control messages (`{ns}.storage_gateway.<node>.<verb>`); bytes never ride here."""
from __future__ import annotations

import enum

import msgspec

from shared.kv.layout import KVKind


class StoreLayout(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """Which model's blocks: the fingerprint names the store namespace; dims size the blocks."""

    fingerprint: bytes  # digest of ModelFingerprint (16 bytes; hex only in the store's directory name)
    model_id: str
    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: str
    block_size: int
    kv_layout: KVKind = KVKind.GQA  # what a Layer Block's two planes hold (K/V, or MLA latent rows)
    latent_rank: int = 0  # MLA: the row split (kv_lora_rank, qk_rope_head_dim, V3.2 index key)
    rope_dim: int = 0
    index_dim: int = 0


class HitQuery(msgspec.Struct, omit_defaults=True):
    layout: StoreLayout
    block_keys: list[bytes]  # the prompt's full blocks', in order


class HitReply(msgspec.Struct, omit_defaults=True):
    blocks: int = 0  # leading block keys present in the store
    error: str = ""


class ReadBlocks(msgspec.Struct, omit_defaults=True):
    req_id: str
    layout: StoreLayout
    block_keys: list[bytes]
    shm: str  # destination buffer segment
    offsets: list[int]  # byte offset in `shm` of each block's payload
    bulk: bool = False  # prefetch (a session's KV during its tool call): waits until no other read is pending
    start_within_s: float = 0.0  # bulk: not started within this long, it is answered with 0 blocks (0: no limit)
    group_layers: int = 0  # read in groups of this many layers, each reported on `progress` (0: whole blocks)
    progress: str = ""  # where the `LayersRead` reports go (a traffic-manager's subject)
    tag: str = ""  # echoed in the reports: which read of a fetch this is


class LayersRead(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A read in layer groups, so far: layers [0, layers) of its first `blocks` blocks are in the buffer."""

    req_id: str
    tag: str
    layers: int
    blocks: int  # blocks whose file exists and whose header checked (the rest of the block keys: a miss)
    eta_s: float = 0.0  # until the read's last byte has crossed the storage NIC


class ReadDone(msgspec.Struct, omit_defaults=True):
    blocks: int = 0  # leading blocks read and verified
    bytes: int = 0
    seconds: float = 0.0
    wait_s: float = 0.0  # time spent queued behind other reads / the bandwidth cap
    stop_reason: str = ""  # why the chain stopped early (missing, corrupt, ...)
    error: str = ""


class WriteBlock(msgspec.Struct, omit_defaults=True):
    layout: StoreLayout
    block_key: bytes
    shm: str
    offset: int


class WriteDone(msgspec.Struct, omit_defaults=True):
    outcome: str = ""  # written | exists | no_space
    error: str = ""


class RetainLevel(enum.IntEnum):
    """Where an agent's hint puts blocks in the store's eviction order."""

    DEMOTED = 0  # evicted before ordinary blocks (reuse_hint: none)
    NORMAL = 1
    RETAINED = 2  # evicted after ordinary blocks until the mark's TTL passes


class Retain(msgspec.Struct, omit_defaults=True):
    """A session's eviction hint, to every gateway: `block_keys` at `level` for `ttl_s`, or with
    `release` the end of every mark `session` set."""

    layout: StoreLayout
    session: str
    block_keys: list[bytes] = []
    level: RetainLevel = RetainLevel.RETAINED
    ttl_s: float = 0.0
    release: bool = False
