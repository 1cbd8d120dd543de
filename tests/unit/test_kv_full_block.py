"""Full Block format: header round trip, Layer Block ranges, typed errors."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from shared.kv.full_block import (
    HEADER_SIZE,
    MAGIC,
    BadMagic,
    BadVersion,
    ChecksumMismatch,
    FingerprintMismatch,
    KeyMismatch,
    LayoutMismatch,
    SizeMismatch,
    decode_header,
    encode_header,
    layer_block_range,
    payload_checksum,
    verify_payload,
)
from shared.kv.layout import KVKind, KVLayout, UnknownDtype

pytestmark = pytest.mark.unit

LAYOUT = KVLayout(n_layers=3, n_kv_heads=2, head_dim=8, dtype="bfloat16", block_size=4)
KEY = bytes(range(16))
FP = bytes(range(100, 116))


def _block() -> tuple[bytearray, np.ndarray]:
    payload = np.arange(LAYOUT.payload_bytes, dtype=np.uint32).astype(np.uint8)
    return encode_header(KEY, FP, LAYOUT, payload_checksum(memoryview(payload))), payload


def test_header_round_trips_and_is_4k() -> None:
    header, payload = _block()
    assert len(header) == HEADER_SIZE == 4096
    assert header[:8] == MAGIC
    got = decode_header(header, expected_key=KEY, expected_fingerprint=FP, expected_layout=LAYOUT)
    assert (got.key, got.fingerprint, got.layout) == (KEY, FP, LAYOUT)
    assert got.payload_length == LAYOUT.payload_bytes
    verify_payload(got, memoryview(payload))


def test_layer_blocks_tile_the_payload_like_the_kv_cache_tensor() -> None:
    # (n_layers, 2, T, H, D) of one block, as the engine's cache slice holds it.
    shape = (LAYOUT.n_layers, 2, LAYOUT.block_size, LAYOUT.n_kv_heads, LAYOUT.head_dim)
    kv = np.arange(np.prod(shape), dtype=np.uint16).reshape(shape)  # 2-byte like bf16
    payload = kv.tobytes()
    assert len(payload) == LAYOUT.payload_bytes
    end = 0
    for layer in range(LAYOUT.n_layers):
        off, length = layer_block_range(LAYOUT, layer)
        assert off == end and length == LAYOUT.layer_bytes
        assert payload[off : off + length] == kv[layer].tobytes()
        end = off + length
    assert end == LAYOUT.payload_bytes
    with pytest.raises(IndexError):
        layer_block_range(LAYOUT, LAYOUT.n_layers)


def test_bad_magic() -> None:
    header, _ = _block()
    header[0] ^= 0xFF
    with pytest.raises(BadMagic) as err:
        decode_header(header)
    assert err.value.got != MAGIC


def test_bad_version() -> None:
    header, _ = _block()
    struct.pack_into("<H", header, 8, 99)
    with pytest.raises(BadVersion) as err:
        decode_header(header)
    assert (err.value.got, err.value.supported) == (99, (2, 3))


@pytest.mark.parametrize("offset", [12, 20, 40, 50, 66, 75, 1000, 4090])
def test_any_flipped_header_byte_fails_the_header_checksum(offset: int) -> None:
    header, _ = _block()
    header[offset] ^= 0x01
    with pytest.raises(ChecksumMismatch) as err:
        decode_header(header, expected_key=KEY)
    assert (err.value.key, err.value.part) == (KEY, "header")


def test_fingerprint_and_key_mismatch_carry_both_values() -> None:
    header, _ = _block()
    other = bytes(16)
    with pytest.raises(FingerprintMismatch) as fp_err:
        decode_header(header, expected_fingerprint=other)
    assert (fp_err.value.expected, fp_err.value.got) == (other, FP)
    with pytest.raises(KeyMismatch) as key_err:
        decode_header(header, expected_key=other)
    assert (key_err.value.expected, key_err.value.got) == (other, KEY)


def test_size_mismatches() -> None:
    header, payload = _block()
    with pytest.raises(SizeMismatch) as short:
        decode_header(header[:100])
    assert (short.value.expected, short.value.got) == (HEADER_SIZE, 100)
    other = KVLayout(n_layers=4, n_kv_heads=2, head_dim=8, dtype="bfloat16", block_size=4)
    with pytest.raises(SizeMismatch):
        decode_header(header, expected_layout=other)
    hdr = decode_header(header)
    with pytest.raises(SizeMismatch):
        verify_payload(hdr, memoryview(payload)[:-1])


def test_flipped_payload_byte_fails_the_payload_checksum() -> None:
    header, payload = _block()
    payload[17] ^= 0x80
    with pytest.raises(ChecksumMismatch) as err:
        verify_payload(decode_header(header), memoryview(payload))
    assert (err.value.key, err.value.part) == (KEY, "payload")


def test_unknown_dtype_is_rejected_early() -> None:
    with pytest.raises(UnknownDtype):
        KVLayout(n_layers=1, n_kv_heads=1, head_dim=1, dtype="float64")


MLA = KVLayout.mla(n_layers=3, latent_rank=24, rope_dim=8, dtype="bfloat16", block_size=4)


def test_an_mla_header_round_trips_its_kind_and_row_split() -> None:
    assert (MLA.n_kv_heads, MLA.head_dim, MLA.kind) == (1, 16, KVKind.MLA)
    payload = bytes(MLA.payload_bytes)
    header = encode_header(KEY, FP, MLA, payload_checksum(payload))
    got = decode_header(header, expected_key=KEY, expected_fingerprint=FP, expected_layout=MLA)
    assert got.layout == MLA and (got.layout.latent_rank, got.layout.rope_dim, got.layout.index_dim) == (24, 8, 0)
    assert struct.unpack_from("<HHIII", header, 80) == (2, 0, 24, 8, 0)
    gqa = encode_header(KEY, FP, LAYOUT, 0)
    assert struct.unpack_from("<HHIII", gqa, 80) == (1, 0, 0, 0, 0)


@pytest.mark.parametrize("other", [
    KVLayout(n_layers=3, n_kv_heads=1, head_dim=16, dtype="bfloat16", block_size=4),  # GQA planes, same bytes
    KVLayout.mla(n_layers=3, latent_rank=16, rope_dim=16, dtype="bfloat16", block_size=4),  # same width, other split
    KVLayout.mla(n_layers=3, latent_rank=16, rope_dim=8, index_dim=8, dtype="bfloat16", block_size=4),  # V3.2 row
], ids=["gqa", "split", "indexer"])
def test_a_block_of_another_layout_with_the_same_byte_count_is_refused(other: KVLayout) -> None:
    assert other.payload_bytes == MLA.payload_bytes
    header = encode_header(KEY, FP, MLA, 0)
    with pytest.raises(LayoutMismatch) as err:
        decode_header(header, expected_fingerprint=FP, expected_layout=other)
    assert (err.value.expected, err.value.got) == (other, MLA)
    assert "mla 24+8" in str(err.value)
    with pytest.raises(LayoutMismatch):
        decode_header(encode_header(KEY, FP, other, 0), expected_layout=MLA)


@pytest.mark.parametrize("kwargs", [
    dict(n_layers=1, n_kv_heads=2, head_dim=8, kind=KVKind.MLA, latent_rank=8, rope_dim=8),  # MLA has one head
    dict(n_layers=1, n_kv_heads=1, head_dim=9, kind=KVKind.MLA, latent_rank=8, rope_dim=8),  # 2 * 9 != 16
    dict(n_layers=1, n_kv_heads=1, head_dim=8, kind=KVKind.GQA, latent_rank=8, rope_dim=8),  # GQA has no split
    dict(n_layers=1, n_kv_heads=1, head_dim=8, kind=KVKind.MLA, latent_rank=16, rope_dim=0),  # no rope key
])
def test_an_inconsistent_layout_is_rejected(kwargs) -> None:
    with pytest.raises(ValueError):
        KVLayout(**kwargs)
