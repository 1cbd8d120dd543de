"""The DeepSeek-specific parts of a ModelConfig: MLA, MoE routing and YaRN RoPE scaling (no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MLAShape:
    q_lora_rank: int = 0  # 0 = plain q_proj (D -> H * (nope + rope)), else q_a -> norm -> q_b
    kv_lora_rank: int = 512  # width of the cached latent c_kv
    qk_nope_head_dim: int = 128  # per-head query/key part without position
    qk_rope_head_dim: int = 64  # decoupled RoPE key, shared by every head, cached with the latent
    v_head_dim: int = 128  # per-head value width

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"MLAShape.{name} must be > 0, got {getattr(self, name)}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim={self.qk_rope_head_dim} must be even for RoPE")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_width(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class MoEShape:
    """DeepSeek-V3 MoE: `noaux_tc` routing over routed experts, plus always-on shared experts."""

    n_routed_experts: int = 8
    n_shared_experts: int = 1  # their MLP width is n_shared_experts * moe_intermediate_size
    experts_per_token: int = 2  # top-k
    moe_intermediate_size: int = 64
    first_k_dense_replace: int = 1  # layers [0, k) use the dense MLP
    moe_layer_freq: int = 1  # of the rest, layer i is MoE when i % freq == 0
    n_group: int = 1  # experts are split into n_group groups ...
    topk_group: int = 1  # ... and only the best topk_group groups may be chosen
    routed_scaling_factor: float = 1.0  # the routed sum is scaled by this
    norm_topk_prob: bool = True  # top-k weights renormalised to sum to 1 (before scaling)

    def __post_init__(self) -> None:
        if self.n_routed_experts <= 0 or self.experts_per_token <= 0 or self.moe_intermediate_size <= 0:
            raise ValueError("MoEShape: n_routed_experts, experts_per_token, moe_intermediate_size must be > 0")
        if self.n_routed_experts % self.n_group:
            raise ValueError(f"n_routed_experts={self.n_routed_experts} not a multiple of n_group={self.n_group}")
        if not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"topk_group={self.topk_group} not in [1, n_group={self.n_group}]")
        per_group = self.n_routed_experts // self.n_group
        if self.experts_per_token > self.topk_group * per_group:
            raise ValueError(f"experts_per_token={self.experts_per_token} > experts in the chosen groups")

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0


@dataclass(frozen=True)
class YarnScaling:
    factor: float = 40.0
    original_max_position: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 1.0


@dataclass(frozen=True)
class IndexerShape:
    """DeepSeek-V3.2 sparse attention: a lightning indexer picks each query's top-k context tokens."""

    n_heads: int = 64  # index_n_heads
    head_dim: int = 128  # index_head_dim
    topk: int = 2048  # index_topk
    rope_dim: int = 64  # the MLA's qk_rope_head_dim: the roped part of every index query and key

    def __post_init__(self) -> None:
        if min(self.n_heads, self.head_dim, self.topk) <= 0 or not 0 < self.rope_dim <= self.head_dim:
            raise ValueError(f"bad IndexerShape {self}")
