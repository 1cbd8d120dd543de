"""Full Block faults: each one's type, fields and the exact text a corrupt-block reply carries."""

from __future__ import annotations

import struct

import pytest
import xxhash

from shared.kv.full_block import (
    HEADER_SIZE,
    BadMagic,
    BadVersion,
    ChecksumMismatch,
    LayoutMismatch,
    SizeMismatch,
    decode_header,
    encode_header,
    payload_checksum,
    verify_payload,
)
from shared.kv.layout import KVLayout

from tests.unit.test_kv_full_block import FP, KEY, LAYOUT

pytestmark = pytest.mark.unit

_VERSION_AT, _DTYPE_AT, _HSIZE_AT, _PLEN_AT, _SUM_AT = 8, 10, 12, 64, 72


def _header(**fields: int) -> bytearray:
    """A valid header with some fields rewritten and its header checksum made good again."""
    buf = encode_header(KEY, FP, LAYOUT, payload_checksum(bytes(LAYOUT.payload_bytes)))
    fmt = {"version": ("<H", _VERSION_AT), "dtype": ("<H", _DTYPE_AT), "hsize": ("<I", _HSIZE_AT),
           "plen": ("<Q", _PLEN_AT), "checksum": ("<Q", _SUM_AT)}
    for name, value in fields.items():
        struct.pack_into(fmt[name][0], buf, fmt[name][1], value)
    struct.pack_into("<Q", buf, HEADER_SIZE - 8, xxhash.xxh3_64_intdigest(bytes(buf[: HEADER_SIZE - 8])))
    return buf


def _size_fault(buf: bytes | bytearray, **kw) -> SizeMismatch:
    with pytest.raises(SizeMismatch) as err:
        decode_header(buf, **kw)
    return err.value


def test_header_size_faults_say_header():
    short = _size_fault(bytes(100))
    assert (short.expected, short.got, short.what, str(short)) == (
        4096, 100, "header", "header size 100 != expected 4096")
    field = _size_fault(_header(hsize=2048))
    assert (field.expected, field.got, field.what, str(field)) == (
        4096, 2048, "header", "header size 2048 != expected 4096")


def test_payload_length_field_must_match_the_layout():
    n = LAYOUT.payload_bytes
    err = _size_fault(_header(plen=n + 1))
    assert (err.expected, err.got, err.what, str(err)) == (n, n + 1, "payload", f"payload size {n + 1} != expected {n}")


def test_an_unknown_dtype_code_is_a_corrupt_layout():
    err = _size_fault(_header(dtype=999))
    assert (err.expected, err.got, err.what) == (0, 0, "layout (unknown KV dtype 999)")
    assert str(err) == "layout (unknown KV dtype 999) size 0 != expected 0"
    assert isinstance(err.__cause__, ValueError)


def test_a_layout_of_other_size_names_the_block_layout():
    other = KVLayout(n_layers=4, n_kv_heads=2, head_dim=8, dtype="bfloat16", block_size=4)
    err = _size_fault(_header(), expected_layout=other)
    n = LAYOUT.payload_bytes
    assert (err.expected, err.got, err.what) == (other.payload_bytes, n, f"layout {LAYOUT}")
    assert str(err) == f"layout {LAYOUT} size {n} != expected {other.payload_bytes}"


def test_a_short_payload_is_a_payload_size_fault():
    hdr = decode_header(_header())
    with pytest.raises(SizeMismatch) as err:
        verify_payload(hdr, bytes(LAYOUT.payload_bytes - 1))
    n = LAYOUT.payload_bytes
    assert (err.value.expected, err.value.got, str(err.value)) == (n, n - 1, f"payload size {n - 1} != expected {n}")


def test_defaults_name_the_payload():
    assert (SizeMismatch(5, 6).what, str(SizeMismatch(5, 6))) == ("payload", "payload size 6 != expected 5")
    fault = ChecksumMismatch(KEY)
    assert (fault.part, str(fault)) == ("payload", f"payload checksum mismatch for block {KEY.hex()}")


def test_bad_magic_and_version_texts():
    buf = _header()
    buf[:8] = b"NOTABLK!"
    with pytest.raises(BadMagic) as magic:
        decode_header(buf)
    assert (magic.value.got, str(magic.value)) == (b"NOTABLK!", "bad Full Block magic b'NOTABLK!'")
    with pytest.raises(BadVersion) as version:
        decode_header(_header(version=7))
    assert str(version.value) == "Full Block format version 7, supported 2, 3"


def test_a_version_2_block_verifies_with_the_whole_payload_hash():
    payload = bytes(range(256)) * (LAYOUT.payload_bytes // 256)
    hdr = decode_header(_header(version=2, checksum=xxhash.xxh3_64_intdigest(payload)))
    assert hdr.version == 2
    verify_payload(hdr, payload)  # a version-3 (segmented) check would fail
    with pytest.raises(ChecksumMismatch):
        verify_payload(decode_header(_header(checksum=xxhash.xxh3_64_intdigest(payload))), payload)


MLA = KVLayout.mla(n_layers=3, latent_rank=24, rope_dim=8, dtype="bfloat16", block_size=4)


@pytest.mark.parametrize(("expected", "text"), [
    (KVLayout(n_layers=3, n_kv_heads=1, head_dim=16, dtype="bfloat16", block_size=4),
     "gqa (L=3 bs=4 H=1 D=16 bfloat16)"),
    (KVLayout.mla(n_layers=3, latent_rank=16, rope_dim=8, index_dim=8, dtype="bfloat16", block_size=4),
     "mla 16+8+8 (L=3 bs=4 H=1 D=16 bfloat16)"),
])
def test_layout_mismatch_describes_both_layouts(expected, text):
    with pytest.raises(LayoutMismatch) as err:
        decode_header(encode_header(KEY, FP, MLA, 0), expected_layout=expected)
    assert str(err.value) == f"KV layout mla 24+8 (L=3 bs=4 H=1 D=16 bfloat16) != expected {text}"
