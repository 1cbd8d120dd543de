"""The one KV-size formula: how many values one token stores per layer, and the cache container.

Owns the arithmetic only (no torch), so the engines' cache (`ModelConfig`, `PagedKVCache`)
and the planners (`dualpath.presets.ModelArch`, hence `dualpath plan` / `dualpath sim`)
count KV from the same function:

- GQA (Llama, Qwen2): K and V of every KV head, ``2 * n_kv_heads * head_dim`` values.
- MLA (DeepSeek-V2/V3/V3.2): one compressed latent plus the decoupled RoPE key shared by
  all heads, ``kv_lora_rank + qk_rope_head_dim`` values (DS-V3: 512 + 64 = 576).
- V3.2's lightning indexer adds its own key, ``index_head_dim`` values, counted apart
  (`index_values_per_token_layer`; the planner's `index_bytes_per_token`) and stored in
  the same row after the latent.

The engines' paged cache is a container of two planes per layer,
``(2, block_size, heads, head_dim)`` (K then V for GQA), so that a Layer Block is one
contiguous byte range whichever attention the model runs. An MLA latent row of width
``W = kv_lora_rank + qk_rope_head_dim`` fills it as ``heads = 1, head_dim = W / 2``: the same
``block_size * W`` values: each token's row split in halves, plane 0 then plane 1 (see
shared/model/mla.py). Every byte offset, Full Block and shm size is then unchanged.
"""

from __future__ import annotations


def kv_values_per_token_layer(n_kv_heads: int, head_dim: int, kv_lora_rank: int = 0,
                              qk_rope_head_dim: int = 0) -> int:
    """Values cached per token per layer: MLA latent + rope key, or K and V of every KV head."""
    if kv_lora_rank > 0:
        return kv_lora_rank + qk_rope_head_dim
    return 2 * n_kv_heads * head_dim


def index_values_per_token_layer(index_head_dim: int = 0) -> int:
    """Values the V3.2 lightning indexer caches per token per layer: one key (0 without it)."""
    return index_head_dim


def cache_container(n_kv_heads: int, head_dim: int, kv_lora_rank: int = 0,
                    qk_rope_head_dim: int = 0, index_head_dim: int = 0) -> tuple[int, int]:
    """(heads, head_dim) of the two-plane cache container holding one token of one layer
    (for MLA: the latent row, plus the indexer key when the model has one)."""
    if kv_lora_rank > 0:
        width = kv_lora_rank + qk_rope_head_dim + index_values_per_token_layer(index_head_dim)
        if width % 2:
            raise ValueError(f"MLA latent width kv_lora_rank + qk_rope_head_dim = {width} must be even")
        return 1, width // 2
    return n_kv_heads, head_dim
