"""The Full Block on-disk format: a 4 KiB header, then the payload layer after layer.

Header bytes: docs/concepts/kv-format.md. No file I/O, naming or eviction here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

from shared.kv.layout import KVLayout, dtype_name, kind_code, kind_of_code
from shared.kv.segment_sum import SegmentHasher, segmented_checksum

MAGIC = b"DPKVBLK\x00"
FORMAT_VERSION = 3  # 2: the KV layout code and MLA row split at bytes [80, 96); 3: the segmented checksum
READ_VERSIONS = (2, 3)  # versions a reader accepts (2: whole-payload xxh3_64)
HEADER_SIZE = 4096
_FIELDS = struct.Struct("<8sHHI16s16sIIIIQQHHIII")  # bytes [0, 96)
_HEADER_SUM = struct.Struct("<Q")
_HEADER_SUM_AT = HEADER_SIZE - _HEADER_SUM.size  # 4088


class FullBlockError(ValueError):
    """Base of every Full Block format error: the block must be treated as a miss."""


class BadMagic(FullBlockError):
    def __init__(self, got: bytes) -> None:
        super().__init__(f"bad Full Block magic {got!r}")
        self.got = got


class BadVersion(FullBlockError):
    def __init__(self, got: int, supported: tuple[int, ...] = READ_VERSIONS) -> None:
        super().__init__(f"Full Block format version {got}, supported {', '.join(map(str, supported))}")
        self.got = got
        self.supported = supported


class FingerprintMismatch(FullBlockError):
    def __init__(self, expected: bytes, got: bytes) -> None:
        super().__init__(f"fingerprint {got.hex()} != expected {expected.hex()}")
        self.expected = expected
        self.got = got


class KeyMismatch(FullBlockError):
    def __init__(self, expected: bytes, got: bytes) -> None:
        super().__init__(f"block key {got.hex()} != expected {expected.hex()}")
        self.expected = expected
        self.got = got


class SizeMismatch(FullBlockError):
    def __init__(self, expected: int, got: int, what: str = "payload") -> None:
        super().__init__(f"{what} size {got} != expected {expected}")
        self.expected = expected
        self.got = got
        self.what = what


class LayoutMismatch(FullBlockError):
    """The block holds another KV layout than the reader's (e.g. GQA K/V read by an MLA engine)."""

    def __init__(self, expected: KVLayout, got: KVLayout) -> None:
        super().__init__(f"KV layout {_describe(got)} != expected {_describe(expected)}")
        self.expected = expected
        self.got = got


def _describe(layout: KVLayout) -> str:
    if layout.rope_dim:
        split = f" {layout.latent_rank}+{layout.rope_dim}" + (f"+{layout.index_dim}" if layout.index_dim else "")
    else:
        split = ""
    return (f"{layout.kind.value}{split} (L={layout.n_layers} bs={layout.block_size} H={layout.n_kv_heads} "
            f"D={layout.head_dim} {layout.dtype})")


class ChecksumMismatch(FullBlockError):
    def __init__(self, key: bytes, part: str = "payload") -> None:
        super().__init__(f"{part} checksum mismatch for block {key.hex()}")
        self.key = key
        self.part = part  # "header" or "payload"


@dataclass(frozen=True, slots=True)
class FullBlockHeader:
    key: bytes
    fingerprint: bytes
    layout: KVLayout
    payload_length: int
    checksum: int  # of the payload, as `version` computes it
    version: int = FORMAT_VERSION


def payload_checksum(payload: memoryview | bytes, version: int = FORMAT_VERSION) -> int:
    """The checksum of a whole payload as format `version` defines it, computed in place (no copy)."""
    return segmented_checksum(payload) if version >= 3 else xxhash.xxh3_64_intdigest(payload)


def payload_hasher(version: int = FORMAT_VERSION) -> SegmentHasher | xxhash.xxh3_64:
    """A streaming hasher whose `intdigest()` equals `payload_checksum` of the bytes fed to it."""
    return SegmentHasher() if version >= 3 else xxhash.xxh3_64()


def check_checksum(header: FullBlockHeader, checksum: int) -> None:
    if checksum != header.checksum:
        raise ChecksumMismatch(header.key, part="payload")


def layer_block_range(layout: KVLayout, layer: int) -> tuple[int, int]:
    return layout.layer_block_range(layer)


def encode_header(
    key: bytes, fingerprint: bytes, layout: KVLayout, checksum: int
) -> bytearray:
    buf = bytearray(HEADER_SIZE)
    _FIELDS.pack_into(
        buf, 0, MAGIC, FORMAT_VERSION, layout.dtype_code, HEADER_SIZE,
        fingerprint, key, layout.n_layers, layout.block_size,
        layout.n_kv_heads, layout.head_dim, layout.payload_bytes, checksum,
        kind_code(layout.kind), 0, layout.latent_rank, layout.rope_dim, layout.index_dim,
    )  # fmt: skip
    _HEADER_SUM.pack_into(buf, _HEADER_SUM_AT, _header_sum(buf))
    return buf


def _header_sum(buf: bytes | bytearray | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(memoryview(buf)[:_HEADER_SUM_AT])


def decode_header(
    buf: bytes | bytearray | memoryview,
    *,
    expected_key: bytes | None = None,
    expected_fingerprint: bytes | None = None,
    expected_layout: KVLayout | None = None,
) -> FullBlockHeader:
    """Parse and verify a header; raises a `FullBlockError` subclass on any fault."""
    if len(buf) < HEADER_SIZE:
        raise SizeMismatch(HEADER_SIZE, len(buf), what="header")
    (magic, version, dcode, hsize, fp, key, n_layers, block_size, n_kv_heads,
     head_dim, plen, checksum, kcode, _, latent, rope, index) = _FIELDS.unpack_from(buf, 0)  # fmt: skip
    if magic != MAGIC:
        raise BadMagic(magic)
    if version not in READ_VERSIONS:
        raise BadVersion(version)
    if _HEADER_SUM.unpack_from(buf, _HEADER_SUM_AT)[0] != _header_sum(buf):
        raise ChecksumMismatch(expected_key or key, part="header")
    if hsize != HEADER_SIZE:
        raise SizeMismatch(HEADER_SIZE, hsize, what="header")
    if expected_fingerprint is not None and fp != expected_fingerprint:
        raise FingerprintMismatch(expected_fingerprint, fp)
    if expected_key is not None and key != expected_key:
        raise KeyMismatch(expected_key, key)
    layout = _layout(dcode, n_layers, block_size, n_kv_heads, head_dim, (kcode, latent, rope, index))
    _check_sizes(layout, plen, expected_layout)
    return FullBlockHeader(key, fp, layout, plen, checksum, version)


def _layout(dcode: int, n_layers: int, bs: int, heads: int, dim: int, kind: tuple[int, int, int, int]) -> KVLayout:
    try:
        return KVLayout(n_layers, heads, dim, dtype_name(dcode), bs, kind_of_code(kind[0]), *kind[1:])
    except ValueError as exc:  # unknown dtype or a zero dim: a corrupt header
        raise SizeMismatch(0, 0, what=f"layout ({exc})") from exc


def _check_sizes(layout: KVLayout, plen: int, expected: KVLayout | None) -> None:
    if plen != layout.payload_bytes:
        raise SizeMismatch(layout.payload_bytes, plen)
    if expected is not None and layout != expected:
        if (layout.kind, layout.latent_rank, layout.rope_dim, layout.index_dim) != (
                expected.kind, expected.latent_rank, expected.rope_dim, expected.index_dim):
            raise LayoutMismatch(expected, layout)
        raise SizeMismatch(expected.payload_bytes, plen, what=f"layout {layout}")


def verify_payload(header: FullBlockHeader, payload: memoryview | bytes) -> None:
    """Raise `SizeMismatch` / `ChecksumMismatch` unless the payload matches."""
    if len(payload) != header.payload_length:
        raise SizeMismatch(header.payload_length, len(payload))
    check_checksum(header, payload_checksum(payload, header.version))
