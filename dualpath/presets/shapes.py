"""Shapes: the fields of one model's architecture and the facts derived from them alone.

Counting is counts.py's; parsing a config.json is arch.py's.
"""
from __future__ import annotations

from dataclasses import dataclass

from shared.model.kv_geometry import kv_values_per_token_layer


@dataclass(frozen=True)
class Shapes:
    """One model's shapes. MoE fields are 0 for dense models; MLA fields 0 for GQA."""

    name: str
    model_type: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # GQA head dim; for MLA the value head dim
    vocab: int
    intermediate: int  # dense MLP intermediate size
    tie_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    # MoE (DeepSeek): layers [first_dense_layers, num_layers) are MoE (when freq 1)
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    first_dense_layers: int = 0
    moe_layer_freq: int = 1
    # MLA (DeepSeek V2/V3): KV is one latent of kv_lora_rank + qk_rope_head_dim
    q_lora_rank: int = 0  # 0 = no LoRA on Q (plain d -> H*(nope+rope))
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # V3.2 sparse-attention indexer (0 = dense attention)
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0

    # ---- derived shape facts
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def is_sparse(self) -> bool:
        return self.index_topk > 0

    @property
    def num_moe_layers(self) -> int:
        if not self.is_moe:
            return 0
        return sum(1 for i in range(self.first_dense_layers, self.num_layers)
                   if i % self.moe_layer_freq == 0)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def qk_head_dim(self) -> int:
        """Per-head q.k dot length: nope + rope for MLA, head_dim for GQA."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def kv_cache_dim(self) -> int:
        """Elements cached per token per layer: latent + rope (MLA) or 2*n_kv*head_dim (the engines' too)."""
        return kv_values_per_token_layer(self.num_kv_heads, self.head_dim, self.kv_lora_rank, self.qk_rope_head_dim)
