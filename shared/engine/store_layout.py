"""How an engine's KV blocks are named and sized in the store (no torch)."""
from __future__ import annotations

from shared.kv.hashing import ModelFingerprint, block_hashes
from shared.messages.storage_gateway import StoreLayout


def store_layout(model_id: str, cfg, block_size: int) -> StoreLayout:
    """`cfg` is a ModelConfig; the fingerprint salts every block key with model, dtype and layout."""
    fp = ModelFingerprint(model_id=model_id, dtype=cfg.dtype, block_size=block_size, n_layers=cfg.n_layers,
                          n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim)
    return StoreLayout(fingerprint=fp.digest(), model_id=model_id, n_layers=cfg.n_layers,
                       n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, dtype=cfg.dtype, block_size=block_size)


def prompt_keys(layout: StoreLayout, tokens: list[int]) -> list[bytes]:
    """Keys of the full blocks of `tokens`."""
    return block_hashes(tokens, layout.block_size, layout.fingerprint)
