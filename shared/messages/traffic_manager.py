"""Traffic-manager control (`{ns}.traffic_manager.<engine>.<verb>`). Bytes never ride here.

Push, load, release, fetch, save and prefetch as exchanged: docs/concepts/request-lifecycle.md.
"""
from __future__ import annotations

import msgspec

from shared.messages.codes import ErrorCode
from shared.messages.storage_gateway import StoreLayout
from shared.messages.work import StagedSlots


class KVWindow(msgspec.Struct, array_like=True, omit_defaults=True):
    """A prompt's hit window (shared/kv/window.py): its first `hits` blocks hold `layers` layers at a time."""

    hits: int
    ring: list[int]
    layers: int
    used: int | None = None  # leading blocks really in the ring (None: all `hits`)


class PushKV(msgspec.Struct, omit_defaults=True):
    req_id: str
    src_blocks: list[int]  # PE KV block ids, in prompt order (NO_BLOCK for hits in the window)
    dst_engine: str  # the DE whose TM buffer receives them
    n_tokens: int = 0
    dst_slots: list[int] = []  # DE-buffer slots already reserved (DE read path), one per src block
    skip: list[int] = []  # block indexes already in the DE buffer (DE-path hits): not sent
    layerwise: bool = False  # send each layer as the PE reports it computed (LayersComputed)
    window: KVWindow | None = None  # where the hits' layers are (src_blocks has no entry for them)
    adopt: str = ""  # the reservation adopts the prefetch staged there under this owner (its engine copied it)
    adopt_block_keys: list[bytes] = []  # ... as far as it matches these (the prompt's leading block keys): not sent


class LayersComputed(msgspec.Struct, array_like=True, gc=False):
    """PE -> its TM: layers 0..layer of these requests' final forward are computed (their KV written)."""

    req_ids: list[str]
    layer: int


class ForwardAlive(msgspec.Struct, array_like=True, gc=False):
    """PE -> its TM: these requests' final forward still runs (a keep-alive for the TM's deadlines)."""

    req_ids: list[str]


class NodeReadDone(msgspec.Struct, array_like=True, gc=False):
    """TM -> schedulers: `node`'s storage reads for the request are over (its read queue drops them)."""

    req_id: str  # as the engines see it: "<request>#<attempt>"
    node: str


class PushDone(msgspec.Struct, omit_defaults=True):
    ok: bool = True
    error: str = ""
    code: ErrorCode | None = None  # when not ok: why (buffer_full, not_ready, kv_transfer, ...)
    slots: list[int] = []
    nbytes: int = 0
    seconds: float = 0.0


class TmAttached(msgspec.Struct, array_like=True):
    """A TM -> its engine, each time it attaches to the engine's KV memory: a new `instance` means
    the TM that copied into that memory before is gone, with its copies."""

    instance: str
    shm_name: str


class Reserve(msgspec.Struct, omit_defaults=True):
    req_id: str
    n_blocks: int
    adopt: str = ""  # prefetched blocks staged here under this owner become the request's first slots
    adopt_block_keys: list[bytes] = []  # ... as far as they match these (the prompt's leading block keys)


class Reserved(msgspec.Struct, omit_defaults=True):
    ok: bool = True
    error: str = ""
    slots: list[int] = []  # byte offsets in the buffer region, one per block
    grant: bytes = b""  # data-plane grant of exactly these slots (encoded Grant): the only way a peer reaches them
    code: ErrorCode | None = None  # when not ok: why
    adopted: int = 0  # slots[:adopted] hold the prompt's leading blocks already (prefetched)


class LoadKV(msgspec.Struct, omit_defaults=True):
    req_id: str
    slots: list[int]  # buffer offsets, one per block
    dst_blocks: list[int]  # KV block ids, same order
    release: bool = True  # free the slots once copied


class Release(msgspec.Struct, omit_defaults=True):
    req_id: str
    used: int = 0  # prefetched blocks its own engine copied straight from the buffer (`StagedSlots`)


class FetchKV(msgspec.Struct, omit_defaults=True):
    req_id: str
    block_keys: list[bytes]  # hit block keys, in prompt order
    dst_blocks: list[int]  # KV blocks receiving them, same order
    node: str  # whose storage-gateway reads the PE-path part
    layout: StoreLayout
    pe_blocks: int  # block_keys[:pe_blocks] on the PE path, block_keys[pe_blocks:] on the DE path
    de_engine: str = ""  # DE-path: the DE whose TM stages the blocks in its buffer
    de_node: str = ""  # DE-path: the DE's node (its gateway reads)
    prompt_blocks: int = 0  # DE-path: DE-buffer slots to reserve for the whole prompt
    window: KVWindow | None = None  # the hits' layers land in this ring (dst_blocks has no entry for them)
    staged_engine: str = ""  # prefetched: the engine whose TM buffer holds block_keys[:staged_blocks] already
    staged_owner: str = ""  # ... under this owner (claimed, copied, then released)
    staged_blocks: int = 0  # block_keys[:staged_blocks] staged; block_keys[staged_blocks:pe_blocks] on the PE path


# Fetch progress: per-layer messages are hot, so arrays; the tag (first element) says which.
class _Progress(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag_field="kind"):
    req_id: str


class ReadQueued(_Progress, tag="queued"):
    """The read waits behind other storage reads long enough to matter for the PE's deadline."""

    eta_s: float  # the storage queue ahead of this read, in seconds (the deadline waits for it)


class ReadFinished(_Progress, tag="read"):
    """The storage read is over: `blocks` leading hits sit in the buffers, copied layer by layer next."""

    blocks: int  # leading hit blocks found (the rest is a miss: computed)
    de_slots: list[int] = []  # DE-path: DE-buffer slots reserved for the whole prompt
    de_hits: list[int] = []  # DE-path: block indexes whose stored KV sits in those slots
    eta_s: float = 0.0  # until their last layer has been read from storage (0: read already)
    layers: int = 0  # layers 0..layers-1 of those blocks are in KV memory already (no LayersLoaded for them)
    staged: int = 0  # blocks[:staged] came from a buffer (prefetched, a kept turn), not from storage
    de_read: int = 0  # the last de_read of `blocks` were read on the DE path; those between, on the PE path


class LayersLoaded(_Progress, tag="layers"):
    layer: int  # layers 0..layer of the read blocks are in KV memory


class FetchFailed(_Progress, tag="failed"):
    """The fetch ended early. Before `ReadFinished`: nothing reached KV memory (the PE computes
    the prompt); after it: the load failed, so does a prefill waiting on the next layer."""

    code: ErrorCode
    error: str
    layers: int = 0  # layers 0..layers-1 of the read blocks had landed in KV memory (a count, 0: none)


FetchProgress = ReadQueued | ReadFinished | LayersLoaded | FetchFailed  # what arrives on `pe.<id>.loaded`
progress_decoder = msgspec.msgpack.Decoder(FetchProgress)


class Stage(msgspec.Struct, omit_defaults=True):
    """DE read path: reserve buffer slots for a whole prompt; read hit blocks into some of them."""

    req_id: str
    prompt_blocks: int  # slots to reserve (one per prompt block)
    first: int  # index of the first block read here
    block_keys: list[bytes]  # keys of blocks first, first+1, ...
    node: str  # the DE's node (gateway)
    layout: StoreLayout
    slots: list[int] = []  # already reserved for req_id (byte offsets, one per prompt block); empty = reserve here
    group_layers: int = 0  # read in layer groups, reported to `progress` (the fetching TM) as they land
    progress: str = ""


class Staged(msgspec.Struct, omit_defaults=True):
    slots: list[int] = []  # buffer offsets, one per prompt block
    blocks: int = 0  # leading `block_keys` read and verified
    error: str = ""
    grant: bytes = b""  # data-plane grant of the prompt's slots (encoded Grant): read staged blocks, write the rest


class SaveKV(msgspec.Struct, omit_defaults=True):
    req_id: str
    blocks: list[int]  # full KV blocks to persist (empty when `slots` names them)
    block_keys: list[bytes]  # their keys
    node: str  # whose storage-gateway writes
    layout: StoreLayout
    slots: list[int] = []  # or: buffer offsets (held by req_id) already holding them, one per block key


class SaveCopied(msgspec.Struct, omit_defaults=True):
    copied: int = 0  # blocks taken for writing (copied out of KV memory, or held in the buffer)
    error: str = ""  # why none were (dropped: the save line was full or waited too long; slots released)


class Prefetch(msgspec.Struct, omit_defaults=True):
    """Stage `block_keys` in spare slots named `owner` (bulk reads), held `ttl_s` unless claimed."""

    owner: str
    block_keys: list[bytes]
    node: str
    layout: StoreLayout
    ttl_s: float


class Prefetched(msgspec.Struct, omit_defaults=True):
    blocks: int = 0  # leading block keys staged (the budget, spare room or a miss may cut the tail)
    error: str = ""
    slots: StagedSlots | None = None  # where they sit, for this TM's own engine to copy without a claim


PENDING_OWNER = "pend-"  # a kept turn's entry is named this + req_id: claimed by a fetch, never adopted


class HoldSaves(msgspec.Struct, omit_defaults=True):
    """A turn ended: `req_id`'s blocks still in this buffer stay as a staged entry (owner
    `pend-<req_id>`) for `ttl_s`, offered to the next turn; answered with `Prefetched`."""

    req_id: str
    block_keys: list[bytes]
    ttl_s: float


class Claim(msgspec.Struct, omit_defaults=True):
    owner: str
    block_keys: list[bytes]  # what the claimer expects staged, in order


class Claimed(msgspec.Struct, omit_defaults=True):
    slots: list[int] = []  # buffer offsets of the leading `block_keys` still staged (empty: nothing usable)
    error: str = ""
    grant: bytes = b""  # data-plane grant of exactly those slots (encoded Grant): the claimer's one-sided reads
