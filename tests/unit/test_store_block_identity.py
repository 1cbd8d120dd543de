"""A Full Block whose header is *internally consistent* (header checksum re-signed) but
names the wrong model, format version, layout or size is never served.

Complements test_kv_full_block.py / test_store_directory.py, whose damaged headers also
fail the header checksum; here only the identity is wrong, so the identity checks alone
must refuse the block: at the format level (typed error) and in the store (a miss).
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import xxhash

from services.storage_gateway.errors import BlockCorrupt, BlockMissing
from shared.kv.full_block import (HEADER_SIZE, BadVersion, FingerprintMismatch, SizeMismatch, decode_header,
                                  encode_header, payload_checksum)
from shared.kv.layout import KVLayout
from tests.unit.store_util import LAYOUT, fill, make_keys, make_store, read_back

pytestmark = pytest.mark.unit

SUM_AT = HEADER_SIZE - 8
KEY = bytes(range(16))
FP = bytes(range(100, 116))
SMALL = KVLayout(n_layers=3, n_kv_heads=2, head_dim=8, dtype="bfloat16", block_size=4)


def resign(header: bytearray) -> bytearray:
    """Recompute the header checksum after an edit (a well-formed header that lies)."""
    struct.pack_into("<Q", header, SUM_AT, xxhash.xxh3_64_intdigest(bytes(header[:SUM_AT])))
    return header


def edited(header: bytes, fmt: str, offset: int, value: int | bytes) -> bytearray:
    buf = bytearray(header)
    struct.pack_into(fmt, buf, offset, value)
    return resign(buf)


def small_header() -> bytearray:
    payload = np.zeros(SMALL.payload_bytes, np.uint8)
    return encode_header(KEY, FP, SMALL, payload_checksum(memoryview(payload)))


# format level ----------------------------------------------------------------------------------

def test_a_resigned_future_version_is_still_refused() -> None:
    with pytest.raises(BadVersion):
        decode_header(edited(small_header(), "<H", 8, 4), expected_fingerprint=FP, expected_layout=SMALL)


def test_a_resigned_foreign_fingerprint_is_refused() -> None:
    with pytest.raises(FingerprintMismatch):
        decode_header(edited(small_header(), "16s", 16, bytes(16)), expected_fingerprint=FP, expected_layout=SMALL)


def test_a_resigned_payload_length_is_refused() -> None:
    with pytest.raises(SizeMismatch):
        decode_header(edited(small_header(), "<Q", 64, SMALL.payload_bytes + 1), expected_layout=SMALL)


def test_a_same_size_layout_of_another_shape_is_refused() -> None:
    # heads and head_dim swapped: the payload has the same byte count, the tensor another shape
    header = edited(edited(small_header(), "<I", 56, SMALL.head_dim), "<I", 60, SMALL.n_kv_heads)
    swapped = KVLayout(n_layers=3, n_kv_heads=8, head_dim=2, dtype="bfloat16", block_size=4)
    assert swapped.payload_bytes == SMALL.payload_bytes
    assert decode_header(header).layout == swapped  # consistent on its own...
    with pytest.raises(SizeMismatch):
        decode_header(header, expected_fingerprint=FP, expected_layout=SMALL)  # ...but not ours


def test_a_resigned_header_size_is_refused() -> None:
    with pytest.raises(SizeMismatch):
        decode_header(edited(small_header(), "<I", 12, 8192))


# store level: the block is a miss, and the store stays consistent --------------------------------

def _rewrite_header(path: str, fmt: str, offset: int, value: int | bytes) -> None:
    with open(path, "r+b") as f:
        header = bytearray(f.read(HEADER_SIZE))
        f.seek(0)
        f.write(edited(header, fmt, offset, value))


@pytest.mark.parametrize("fmt,offset,value,reason", [
    ("<H", 8, 4, "version"),
    ("<H", 8, 1, "version"),  # a block written before the layout code existed
    ("16s", 16, bytes(16), "fingerprint"),
    ("<Q", 64, LAYOUT.payload_bytes + 16, "size"),
    ("<I", 52, LAYOUT.block_size * 2, "size"),  # another block size: the payload length no longer matches
], ids=["version", "version-1", "fingerprint", "payload-length", "block-size"])
def test_a_stored_block_with_a_wrong_identity_is_never_served(tmp_path: Path, fmt, offset, value, reason) -> None:
    store = make_store(tmp_path)
    keys = make_keys(2)
    fill(store, keys)
    _rewrite_header(store.path_for(keys[0]), fmt, offset, value)
    with pytest.raises(BlockCorrupt) as err:
        read_back(store, keys[0])
    assert reason in err.value.reason.lower()
    with pytest.raises((BlockCorrupt, BlockMissing)):  # and never afterwards either
        read_back(store, keys[0])
    assert store.longest_prefix(keys) == 0  # a chain cannot continue past it
    store.check_integrity()


def test_a_stored_block_with_a_trailing_byte_is_never_served(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    key = make_keys(1)[0]
    fill(store, [key])
    with open(store.path_for(key), "ab") as f:
        f.write(b"\x00")
    with pytest.raises(BlockCorrupt):
        read_back(store, key)
    store.check_integrity()


def test_a_block_of_another_kv_layout_is_never_served_to_an_engine_of_this_one(tmp_path: Path) -> None:
    """The same fingerprint and byte count: GQA planes (2 heads x 32 dims) written, an MLA row
    (latent 112 + rope 16, halves of 64) expected; the header's layout code refuses it."""
    from services.storage_gateway.store import DirectoryStore
    from tests.unit.store_util import FINGERPRINT

    gqa = make_store(tmp_path)
    keys = make_keys(2)
    fill(gqa, keys)
    mla = KVLayout.mla(n_layers=2, latent_rank=112, rope_dim=16, dtype="float16", block_size=16)
    assert mla.payload_bytes == LAYOUT.payload_bytes
    reader = DirectoryStore(tmp_path, FINGERPRINT, mla)
    with pytest.raises(BlockCorrupt) as err:
        read_back(reader, keys[0])
    assert "layout" in err.value.reason.lower() and "mla" in err.value.reason.lower()
    assert reader.longest_prefix(keys) == 0
    reader.check_integrity()
