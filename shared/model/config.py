"""ModelConfig: the architecture of one decoder, as one frozen dataclass (no weights, no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.model.deepseek_shapes import IndexerShape, MLAShape, MoEShape, YarnScaling
from shared.model.kv_geometry import cache_container, index_values_per_token_layer, kv_values_per_token_layer

_ARCHS = ("llama", "deepseek_v3")
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


@dataclass(frozen=True)
class ModelConfig:
    name: str = "tiny"  # human-readable model name
    vocab_size: int = 259  # rows of the embedding / columns of the logits
    hidden_size: int = 128  # residual stream width (d_model)
    intermediate_size: int = 384  # SwiGLU hidden width
    n_layers: int = 4  # decoder blocks
    n_heads: int = 4  # query heads
    n_kv_heads: int = 2  # key/value heads (GQA: n_heads % n_kv_heads == 0)
    head_dim: int = 32  # per-head width (usually hidden_size // n_heads)
    rope_theta: float = 10000.0  # RoPE base frequency
    rms_eps: float = 1e-5  # RMSNorm epsilon
    max_position: int = 4096  # context length the model was trained for
    tie_embeddings: bool = True  # lm_head shares the embedding matrix
    attn_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    bos_id: int | None = None  # beginning-of-sequence token, if the model uses one
    eos_ids: tuple[int, ...] = ()  # any of these ends generation
    dtype: str = "float32"  # weight and KV dtype ("float32" on CPU)
    arch: str = "llama"  # decoder family: "llama" (GQA, dense MLP) or "deepseek_v3" (MLA, MoE)
    mla: MLAShape | None = None  # deepseek_v3: latent attention (then head_dim is v_head_dim)
    moe: MoEShape | None = None  # deepseek_v3: routed + shared experts (None: every layer dense)
    yarn: YarnScaling | None = None  # deepseek_v3: YaRN RoPE scaling, when config.json has it
    indexer: IndexerShape | None = None  # deepseek V3.2: sparse attention (lightning indexer + top-k)

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.dtype not in _ITEMSIZE:
            raise ValueError(f"dtype={self.dtype!r} not one of {sorted(_ITEMSIZE)}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.arch not in _ARCHS:
            raise ValueError(f"arch={self.arch!r} not one of {_ARCHS}")
        if (self.arch == "deepseek_v3") != (self.mla is not None):
            raise ValueError(f"arch={self.arch!r}: MLA is used by deepseek_v3 and only by it")
        if self.indexer is not None and self.mla is None:
            raise ValueError("the sparse-attention indexer needs MLA")
        _ = self.kv_cache_container  # raises for an odd MLA latent width (it cannot fill two planes)

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.dtype]

    @property
    def kv_cache_container(self) -> tuple[int, int]:
        """(heads, head_dim) of one cache plane: (n_kv_heads, head_dim), or (1, latent/2) for MLA."""
        m, ix = self.mla, self.indexer
        return cache_container(self.n_kv_heads, self.head_dim, m.kv_lora_rank if m else 0,
                               m.qk_rope_head_dim if m else 0, ix.head_dim if ix else 0)

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        m, ix = self.mla, self.indexer
        values = kv_values_per_token_layer(self.n_kv_heads, self.head_dim, m.kv_lora_rank if m else 0,
                                           m.qk_rope_head_dim if m else 0)
        return (values + index_values_per_token_layer(ix.head_dim if ix else 0)) * self.itemsize

    @property
    def kv_bytes_per_token(self) -> int:
        return self.n_layers * self.kv_bytes_per_token_per_layer
