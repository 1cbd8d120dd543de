"""Block identity: the model fingerprint and chained block keys.

A key names a prefix: `h_i = xxh3_128(h_{i-1} || tokens_i as int32 LE)`, `h_{-1}` the model
fingerprint; only full blocks get keys. Keys travel as raw bytes; hex is for names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

from shared.kv.layout import KVKind, KVLayout

KEY_BYTES = 16
FINGERPRINT_BYTES = 16
LAYOUT_VERSION = 1  # bump when the paged-KV layout (axis order, K/V split) changes
_TOKEN_DTYPE = np.dtype("<i4")


@dataclass(frozen=True, slots=True)
class ModelFingerprint:
    """Everything that makes stored KV bytes of one model (in)compatible."""

    model_id: str
    dtype: str
    block_size: int
    n_layers: int
    n_kv_heads: int
    head_dim: int
    layout_version: int = LAYOUT_VERSION
    kind: KVKind = KVKind.GQA  # what the planes hold; MLA adds its row split to the digest
    latent_rank: int = 0
    rope_dim: int = 0
    index_dim: int = 0

    @classmethod
    def from_layout(
        cls, model_id: str, layout: KVLayout, layout_version: int = LAYOUT_VERSION
    ) -> ModelFingerprint:
        return cls(
            model_id=model_id,
            dtype=layout.dtype,
            block_size=layout.block_size,
            n_layers=layout.n_layers,
            n_kv_heads=layout.n_kv_heads,
            head_dim=layout.head_dim,
            layout_version=layout_version,
            kind=layout.kind,
            latent_rank=layout.latent_rank,
            rope_dim=layout.rope_dim,
            index_dim=layout.index_dim,
        )

    @property
    def layout(self) -> KVLayout:
        return KVLayout(
            n_layers=self.n_layers,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            dtype=self.dtype,
            block_size=self.block_size,
            kind=self.kind,
            latent_rank=self.latent_rank,
            rope_dim=self.rope_dim,
            index_dim=self.index_dim,
        )

    def canonical(self) -> bytes:
        """The exact bytes hashed into the digest (a fixed, versioned text form)."""
        fields = (
            f"dualpath-kv/v{self.layout_version}",
            self.model_id,
            self.dtype,
            f"bs={self.block_size}",
            f"L={self.n_layers}",
            f"H={self.n_kv_heads}",
            f"D={self.head_dim}",
        )
        if KVKind(self.kind) is KVKind.MLA:  # GQA digests stay what they were before MLA existed
            fields += ("kv=mla", f"C={self.latent_rank}", f"R={self.rope_dim}", f"I={self.index_dim}")
        return "\x1f".join(fields).encode("utf-8")

    def digest(self) -> bytes:
        """16-byte stable digest; the salt of every block key of this model."""
        return xxhash.xxh3_128_digest(self.canonical())


def _as_tokens(token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Contiguous little-endian int32; out-of-range ids raise `OverflowError` (numpy would wrap)."""
    if isinstance(token_ids, np.ndarray) and token_ids.dtype != _TOKEN_DTYPE:
        info = np.iinfo(_TOKEN_DTYPE)
        if token_ids.size and (token_ids.min() < info.min or token_ids.max() > info.max):
            raise OverflowError("token id outside int32")
    return np.ascontiguousarray(token_ids, dtype=_TOKEN_DTYPE)


def chain_hash(parent: bytes, block_tokens: Sequence[int] | np.ndarray) -> bytes:
    """Key of one block given its parent's key (or the fingerprint for block 0)."""
    data = _as_tokens(block_tokens)
    h = xxhash.xxh3_128(parent)
    h.update(memoryview(data).cast("B"))
    return h.digest()


def block_hashes(
    token_ids: Sequence[int] | np.ndarray, block_size: int, fingerprint: bytes
) -> list[bytes]:
    """Chained keys of every full block of `token_ids` (partial tail ignored)."""
    if block_size <= 0:
        raise ValueError("block_size must be > 0")
    tokens = _as_tokens(token_ids)
    n_full = len(tokens) // block_size
    raw = memoryview(tokens[: n_full * block_size]).cast("B")
    stride = block_size * _TOKEN_DTYPE.itemsize
    keys: list[bytes] = []
    parent = fingerprint
    for i in range(n_full):
        h = xxhash.xxh3_128(parent)
        h.update(raw[i * stride : (i + 1) * stride])
        parent = h.digest()
        keys.append(parent)
    return keys


def key_hex(key: bytes) -> str:
    return key.hex()


def key_from_hex(text: str) -> bytes:
    return check_key(bytes.fromhex(text))


def check_key(key: bytes) -> bytes:
    """`key` if it is a block key's size, else `ValueError` (keys from the wire)."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"block key must be {KEY_BYTES} bytes, got {len(key)}")
    return key
