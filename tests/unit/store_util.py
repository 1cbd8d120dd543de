"""Helpers shared by the storage-gateway unit tests: a tiny layout, keys, payloads."""

from __future__ import annotations

import numpy as np

from services.storage_gateway.store import DirectoryStore
from shared.kv.full_block import HEADER_SIZE
from shared.kv.hashing import ModelFingerprint, block_hashes
from shared.kv.layout import KVLayout

# 2 layers x (2, 16 tokens, 2 heads, 32 dims) x fp16 = 8 KiB payload per block.
LAYOUT = KVLayout(n_layers=2, n_kv_heads=2, head_dim=32, dtype="float16", block_size=16)
FINGERPRINT = ModelFingerprint.from_layout("test-model", LAYOUT).digest()
PAYLOAD = LAYOUT.payload_bytes
FILE_BYTES = HEADER_SIZE + PAYLOAD


def make_keys(n: int, start: int = 0) -> list[bytes]:
    tokens = np.arange(start, start + n * LAYOUT.block_size, dtype=np.int64)
    return block_hashes(tokens, LAYOUT.block_size, FINGERPRINT)


def payload_for(key: bytes) -> np.ndarray:
    """Deterministic payload bytes derived from the key (same in every process)."""
    rng = np.random.default_rng(int.from_bytes(key[:8], "little"))
    return rng.integers(0, 256, PAYLOAD, dtype=np.uint8)


def make_store(root: object, capacity_bytes: int | None = None, **kw: object) -> DirectoryStore:
    return DirectoryStore(root, FINGERPRINT, LAYOUT, capacity_bytes, **kw)  # type: ignore[arg-type]


def fill(store: DirectoryStore, keys: list[bytes]) -> None:
    for key in keys:
        store.write(key, memoryview(payload_for(key)))


def read_back(store: DirectoryStore, key: bytes) -> np.ndarray:
    out = np.zeros(PAYLOAD, np.uint8)
    store.read_into(key, memoryview(out))
    return out
