"""Traffic-manager control (`{ns}.traffic_manager.<engine>.<verb>`). Bytes never ride here.

Push (PE side, after prefill):
  PE --PushKV--> its TM; TM --Reserve--> DE's TM (reply: buffer slots);
  TM writes each KV block from PE KV memory into those slots on the data plane;
  TM --PushDone--> PE (slots, bytes). The PE then admits the request on the DE.
Load (DE side): DE --LoadKV--> its TM: copy buffer slots -> KV blocks, free the slots.
Release: free a request's slots (cancel, failure).
Fetch (PE read path): PE --FetchKV--> its TM, which reports on `pe.<id>.loaded` with one
  message type per meaning (the `FetchProgress` union, one Decoder: `progress_decoder`):
    [ReadQueued(eta_s): the read waits behind a storage queue; the PE's deadline waits too]
    ReadFinished(blocks, de_slots, de_hits, eta_s, layers, staged, de_read): the hit blocks are found
      (0: a miss after all); their layers land in groups within eta_s (a read in layer groups), or have
      landed; `layers` > 0: those layers are in KV memory already (every hit was prefetched into the
      TM's buffer); where they came from: `staged` leading ones from a buffer, `de_read` trailing
      ones on the DE path, the rest on the PE path (the engine's prompt-token tiers)
    LayersLoaded(layer) ...: layers 0..layer are in KV memory (the PE computes them meanwhile)
  or, at any point, FetchFailed(code, error): before ReadFinished the PE computes the whole
  prompt (nothing reached its KV memory); after, the load failed and so does the prefill.
Layerwise push (PE side, during the final forward of a prompt): PE --PushKV(layerwise)--> its
  TM at the forward's start; the PE reports LayersComputed(layer) after each layer, and the TM
  sends that layer of the prompt's blocks to the DE buffer while the next layer computes;
  PushDone once the last layer has landed. A Release (or Cancel) of the request ends it early.
Reads done: when a node's share of a fetch's storage reads is over, the TM tells the schedulers
  (NodeReadDone, broadcast): that node's read queue no longer counts it.
Save (persistence): engine --SaveKV--> its TM: copy full blocks KV -> buffer (bulk; waiting in a
  bounded line for spare slots), reply SaveCopied (the engine may now free those blocks), then
  write them through the gateway. With `slots` the blocks are already in the TM's buffer (a
  prompt the DE received): written from there, those slots held until the write is over.
Prefetch (agent sessions, during a tool call): scheduler --Prefetch(owner, block_keys)--> a TM, which
  stages the stored blocks in spare buffer slots named `owner` (bulk reads, in chunks) and
  replies Prefetched. A later FetchKV naming them (`staged_*`) has its TM --Claim--> the
  holder (reply Claimed: the slots of the leading keys still staged), copies those layer by
  layer like any buffered block (a local copy, or a one-sided read from the holder), and
  releases `owner`. When the holder is the request's DE, its Reserve adopts them instead:
  they become the prompt's first DE-buffer slots, read by the PE like DE-path hits and never
  pushed back. Unclaimed staged slots go back on Release, at their TTL, or as soon as a
  real reservation needs the room (a prefetch never blocks a read). Prefetched also says where
  the blocks sit with a stamp (`StagedSlots`, shared/kv/staged_table.py); when they are in the
  buffer of the PE's own TM the PE copies them from there itself, no FetchKV, and tells that TM
  afterwards: Release(owner, used=n).
"""
from __future__ import annotations

import msgspec

from shared.messages.codes import ErrorCode
from shared.messages.storage_gateway import StoreLayout
from shared.messages.work import StagedSlots


class KVWindow(msgspec.Struct, array_like=True, omit_defaults=True):
    """A prompt's hit window (shared/kv/window.py `HitWindow`): its first `hits` blocks hold `layers`
    layers at a time in the Layer Blocks of the `ring` blocks."""

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
    """PE -> its TM: these requests' final forward is still running (a keep-alive: it restarts the
    TM's deadlines for them, nothing more)."""

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
    """A TM -> its engine (`engine.<id>.tm`), each time it attaches to the engine's KV memory: a
    new `instance` means the TM that copied into that memory before is gone, with its copies."""

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
    """The storage read is over: `blocks` leading hits sit in the buffers, copied layer by layer next
    (a short read only means fewer hits: why is on the traffic-manager's `kv_fetch` span)."""

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
    """Stage `block_keys` (a session's stored prefix) in spare slots named `owner`, read by `node`'s
    gateway in the bulk lane; hold them `ttl_s` unless claimed."""

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
    """A turn ended (the scheduler): `req_id`'s blocks still in this buffer -- saved, maybe not yet
    written -- stay there as a staged entry (owner `pend-<req_id>`) for `ttl_s`, offered to the next
    turn like a prefetch. `block_keys`: the turn's (prompt + generated), in order; answered
    with `Prefetched` (the leading keys held)."""

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
