"""ModelArch: the shapes of one model, parsed from a Hugging Face config.json.

Llama / Qwen2 / DeepSeek-V2/V3/V3.2-style configs; the counts come from counts.py. No hardware
or parallelism assumptions (those are `dualpath.plan`'s).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dualpath.presets import counts
from dualpath.presets.counts import ParamCounts
from dualpath.presets.shapes import Shapes


class ArchConfigError(ValueError):
    """A config.json that lacks a field the architecture needs, or has a bad value."""

    def __init__(self, source: str, key: str, why: str) -> None:
        super().__init__(f"{source}: {key}: {why}")
        self.source, self.key, self.why = source, key, why


@dataclass(frozen=True)
class ModelArch(Shapes):
    """One model's shapes (see Shapes) with the counts every planner asks of them."""

    # ---- counts (delegated to pure functions in counts.py)
    def attention_params_per_layer(self) -> int:
        return counts.attention_per_layer(self)

    def params(self) -> ParamCounts:
        return counts.param_counts(self)

    def kv_bytes_per_token(self, dtype_bytes: float) -> float:
        """KV-cache bytes one token occupies across all layers (no indexer keys)."""
        return self.num_layers * self.kv_cache_dim * dtype_bytes

    def index_bytes_per_token(self, dtype_bytes: float) -> float:
        """V3.2 indexer key cache per token, all layers (0 for dense attention)."""
        return self.num_layers * self.index_head_dim * dtype_bytes

    def prefill_flops_per_token(self) -> float:
        """Linear-layer FLOPs per prefilled token: 2 * active non-embedding params."""
        return counts.linear_flops_per_token(self)

    def attention_flops(self, cached: int, new: int) -> float:
        """Score + value FLOPs, all layers, for `new` tokens after `cached` ones (causal)."""
        return counts.attention_flops(self, cached, new)

    def replace(self, **changes: Any) -> "ModelArch":
        return dataclasses.replace(self, **changes)


def _get(cfg: dict[str, Any], source: str, key: str, default: Any = None) -> Any:
    value = cfg.get(key, default)
    if value is None:
        raise ArchConfigError(source, key, "missing")
    return value


def _int(cfg: dict[str, Any], key: str, default: int = 0) -> int:
    value = cfg.get(key)
    return default if value is None else int(value)


def from_config(cfg: dict[str, Any], name: str) -> ModelArch:
    """Parse an HF config dict; raises ArchConfigError naming the first missing key."""
    hidden = int(_get(cfg, name, "hidden_size"))
    heads = int(_get(cfg, name, "num_attention_heads"))
    mla = _int(cfg, "kv_lora_rank") > 0
    head_dim = _int(cfg, "v_head_dim") if mla else _int(cfg, "head_dim", hidden // heads)
    arch = ModelArch(
        name=name,
        model_type=str(cfg.get("model_type", "unknown")),
        num_layers=int(_get(cfg, name, "num_hidden_layers")),
        hidden=hidden,
        num_heads=heads,
        num_kv_heads=_int(cfg, "num_key_value_heads", heads),
        head_dim=head_dim,
        vocab=int(_get(cfg, name, "vocab_size")),
        intermediate=int(_get(cfg, name, "intermediate_size")),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
        n_routed_experts=_int(cfg, "n_routed_experts", _int(cfg, "num_experts")),
        n_shared_experts=_int(cfg, "n_shared_experts"),
        experts_per_token=_int(cfg, "num_experts_per_tok"),
        moe_intermediate=_int(cfg, "moe_intermediate_size"),
        first_dense_layers=_int(cfg, "first_k_dense_replace"),
        moe_layer_freq=_int(cfg, "moe_layer_freq", 1) or 1,
        q_lora_rank=_int(cfg, "q_lora_rank"),
        kv_lora_rank=_int(cfg, "kv_lora_rank"),
        qk_nope_head_dim=_int(cfg, "qk_nope_head_dim") if mla else 0,
        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim") if mla else 0,
        v_head_dim=_int(cfg, "v_head_dim") if mla else 0,
        index_n_heads=_int(cfg, "index_n_heads"),
        index_head_dim=_int(cfg, "index_head_dim"),
        index_topk=_int(cfg, "index_topk"),
    )
    _validate(arch)
    return arch


def _validate(arch: ModelArch) -> None:
    for field in ("num_layers", "hidden", "num_heads", "num_kv_heads", "vocab", "head_dim"):
        if getattr(arch, field) <= 0:
            raise ArchConfigError(arch.name, field, f"must be > 0, got {getattr(arch, field)}")
    if arch.num_heads % arch.num_kv_heads:
        raise ArchConfigError(arch.name, "num_key_value_heads",
                          f"{arch.num_kv_heads} does not divide {arch.num_heads} heads")
    if arch.is_moe and (arch.experts_per_token <= 0 or arch.moe_intermediate <= 0):
        raise ArchConfigError(arch.name, "num_experts_per_tok/moe_intermediate_size",
                          "MoE config needs both > 0")
