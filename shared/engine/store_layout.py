"""How an engine's KV blocks are named, sized and laid out in the store. No torch.

Layout and key fingerprint both come from `engine_kv_layout`: no block is served across layouts.
"""
from __future__ import annotations

from shared.kv.hashing import ModelFingerprint, block_hashes
from shared.kv.layout import KVKind, KVLayout
from shared.messages.storage_gateway import StoreLayout


def engine_kv_layout(cfg, block_size: int) -> KVLayout:
    """`cfg` is a ModelConfig: the layout of one block of its paged cache."""
    heads, dim = cfg.kv_cache_container
    if cfg.mla is None:
        return KVLayout(cfg.n_layers, heads, dim, cfg.dtype, block_size)
    index = cfg.indexer.head_dim if cfg.indexer is not None else 0
    layout = KVLayout.mla(cfg.n_layers, cfg.mla.kv_lora_rank, cfg.mla.qk_rope_head_dim, index, cfg.dtype, block_size)
    assert (layout.n_kv_heads, layout.head_dim) == (heads, dim), "kv_geometry and KVLayout.mla disagree"
    return layout


def store_layout(model_id: str, cfg, block_size: int) -> StoreLayout:
    """The fingerprint salts every block key with model, dtype and layout (kind and dims)."""
    kv = engine_kv_layout(cfg, block_size)
    fp = ModelFingerprint.from_layout(model_id, kv)
    return StoreLayout(fingerprint=fp.digest(), model_id=model_id, n_layers=kv.n_layers,
                       n_kv_heads=kv.n_kv_heads, head_dim=kv.head_dim, dtype=kv.dtype, block_size=block_size,
                       kv_layout=kv.kind, latent_rank=kv.latent_rank, rope_dim=kv.rope_dim, index_dim=kv.index_dim)


def kv_layout(layout: StoreLayout) -> KVLayout:
    """The block layout a StoreLayout names (what the gateway checks every stored block against)."""
    return KVLayout(layout.n_layers, layout.n_kv_heads, layout.head_dim, layout.dtype, layout.block_size,
                    KVKind(layout.kv_layout), layout.latent_rank, layout.rope_dim, layout.index_dim)


def prompt_keys(layout: StoreLayout, tokens: list[int]) -> list[bytes]:
    return block_hashes(tokens, layout.block_size, layout.fingerprint)
