"""The one KV-size formula (no torch): values per token per layer, and the cache container."""

from __future__ import annotations


def kv_values_per_token_layer(n_kv_heads: int, head_dim: int, kv_lora_rank: int = 0,
                              qk_rope_head_dim: int = 0) -> int:
    """Values cached per token per layer: MLA latent + rope key, or K and V of every KV head."""
    if kv_lora_rank > 0:
        return kv_lora_rank + qk_rope_head_dim
    return 2 * n_kv_heads * head_dim


def index_values_per_token_layer(index_head_dim: int = 0) -> int:
    return index_head_dim


def cache_container(n_kv_heads: int, head_dim: int, kv_lora_rank: int = 0,
                    qk_rope_head_dim: int = 0, index_head_dim: int = 0) -> tuple[int, int]:
    if kv_lora_rank > 0:
        width = kv_lora_rank + qk_rope_head_dim + index_values_per_token_layer(index_head_dim)
        if width % 2:
            raise ValueError(f"MLA latent width kv_lora_rank + qk_rope_head_dim = {width} must be even")
        return 1, width // 2
    return n_kv_heads, head_dim
