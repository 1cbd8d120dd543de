"""Block keys: chained, salted by the model fingerprint, stable across processes."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shared.kv.hashing import (
    ModelFingerprint,
    block_hashes,
    chain_hash,
    key_from_hex,
    key_hex,
)
from shared.kv.layout import KVLayout

pytestmark = pytest.mark.unit

FP = ModelFingerprint("golden", "bfloat16", 64, 4, 2, 8)
REPO = Path(__file__).resolve().parents[2]


def test_golden_values_never_change() -> None:
    # Stored blocks outlive processes and releases: these bytes are a contract.
    fp = FP.digest()
    assert fp.hex() == "6d2926843164d2d558ca13cc6ad28052"
    assert block_hashes(list(range(130)), 64, fp)[1].hex() == (
        "f963e68acf92d56272447cb7e2ba9b22"
    )


def test_another_process_computes_identical_keys() -> None:
    tokens = [(i * 7919) % 151_000 for i in range(1000)]
    here = [key_hex(k) for k in block_hashes(tokens, 64, FP.digest())]
    code = (
        "from shared.kv.hashing import ModelFingerprint, block_hashes\n"
        "fp = ModelFingerprint('golden', 'bfloat16', 64, 4, 2, 8).digest()\n"
        "tokens = [(i * 7919) % 151_000 for i in range(1000)]\n"
        "print(' '.join(k.hex() for k in block_hashes(tokens, 64, fp)))\n"
    )
    env = {"PYTHONPATH": str(REPO), "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
        text=True, check=True, timeout=60,
    )  # fmt: skip
    assert out.stdout.split() == here


def test_changing_a_token_changes_its_block_and_every_later_key_only() -> None:
    fp = FP.digest()
    tokens = list(range(64 * 6))
    base = block_hashes(tokens, 64, fp)
    tokens[64 * 3 + 5] += 1  # a token of block 3
    changed = block_hashes(tokens, 64, fp)
    assert changed[:3] == base[:3]
    assert all(a != b for a, b in zip(changed[3:], base[3:], strict=True))


def test_only_full_blocks_get_keys() -> None:
    fp = FP.digest()
    assert len(block_hashes(list(range(63)), 64, fp)) == 0
    assert len(block_hashes(list(range(64 * 3 + 10)), 64, fp)) == 3
    assert block_hashes(list(range(64 * 3 + 10)), 64, fp) == block_hashes(
        list(range(64 * 3)), 64, fp
    )


@pytest.mark.parametrize(
    "change",
    [
        {"model_id": "other"},
        {"dtype": "float16"},
        {"block_size": 32},
        {"n_layers": 5},
        {"n_kv_heads": 4},
        {"head_dim": 16},
        {"layout_version": 2},
    ],
)
def test_every_fingerprint_field_salts_the_keys(change: dict[str, object]) -> None:
    other = dataclasses.replace(FP, **change)  # type: ignore[arg-type]
    assert other.digest() != FP.digest()
    tokens = list(range(128))
    assert block_hashes(tokens, 64, other.digest())[0] != block_hashes(tokens, 64, FP.digest())[0]


def test_numpy_input_and_incremental_chain_agree_with_lists() -> None:
    fp = FP.digest()
    tokens = [5, 6, 7] * 100
    keys = block_hashes(tokens, 64, fp)
    assert block_hashes(np.asarray(tokens, dtype=np.int64), 64, fp) == keys
    parent = fp
    for i, key in enumerate(keys):
        parent = chain_hash(parent, tokens[i * 64 : (i + 1) * 64])
        assert parent == key


def test_fingerprint_round_trips_through_layout() -> None:
    layout = KVLayout(n_layers=4, n_kv_heads=2, head_dim=8, dtype="bfloat16", block_size=64)
    assert ModelFingerprint.from_layout("golden", layout) == FP
    assert FP.layout == layout


def test_key_hex_round_trip_and_bad_names() -> None:
    key = block_hashes(list(range(64)), 64, FP.digest())[0]
    assert len(key_hex(key)) == 32
    assert key_from_hex(key_hex(key)) == key
    with pytest.raises(ValueError):
        key_from_hex("abcd")


def test_a_100k_token_prompt_has_one_distinct_key_per_full_block() -> None:
    keys = block_hashes(list(range(100_000)), 64, FP.digest())
    assert len(keys) == 100_000 // 64 == len(set(keys))


def test_token_ids_outside_int32_are_rejected() -> None:
    with pytest.raises(OverflowError):
        block_hashes([2**31] * 64, 64, FP.digest())
    with pytest.raises(OverflowError):
        block_hashes(np.full(64, 2**31, dtype=np.int64), 64, FP.digest())


def test_an_mla_fingerprint_round_trips_and_spells_its_row_split() -> None:
    layout = KVLayout.mla(n_layers=3, latent_rank=24, rope_dim=6, index_dim=2, block_size=4)
    fp = ModelFingerprint.from_layout("ds", layout, layout_version=7)
    assert fp.layout == layout and fp.layout_version == 7
    assert fp.canonical() == "\x1f".join(
        ["dualpath-kv/v7", "ds", "bfloat16", "bs=4", "L=3", "H=1", "D=16", "kv=mla", "C=24", "R=6", "I=2"]
    ).encode()


def test_the_int32_range_ends_are_token_ids() -> None:
    lo, hi = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    wide = np.array([lo, hi], dtype=np.int64)
    assert block_hashes(wide, 2, FP.digest()) == block_hashes([lo, hi], 2, FP.digest())
    with pytest.raises(OverflowError, match="^token id outside int32$"):
        block_hashes(np.array([lo - 1, 0], dtype=np.int64), 2, FP.digest())


def test_block_size_one_keys_every_token_and_zero_is_refused() -> None:
    keys = block_hashes([5, 6, 7], 1, FP.digest())
    assert keys == [chain_hash(FP.digest(), [5]), chain_hash(keys[0], [6]), chain_hash(keys[1], [7])]
    with pytest.raises(ValueError, match="^block_size must be > 0$"):
        block_hashes([5, 6], 0, FP.digest())


def test_a_wire_key_of_the_wrong_size_names_its_length() -> None:
    with pytest.raises(ValueError, match="^block key must be 16 bytes, got 2$"):
        key_from_hex("abcd")
