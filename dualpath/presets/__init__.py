"""Model presets: Hugging Face config.json files and the ModelArch parsed from them.

Shipped presets (package data, one small JSON each): `ds-v3`, `ds-v3.2-660b`
(V3 plus the V3.2 sparse-attention indexer fields), `ds-27b` (the down-scaled DeepSeek
of the paper's evaluation: docs/concepts/design.md#published-figures), `qwen2.5-32b`, `llama-3-70b`,
`smollm2-135m`.

Stable API (other tools depend on it; add fields with defaults, never change types):

    from dualpath.presets import load_arch, preset_names, ModelArch, ArchConfigError
    arch = load_arch("ds-v3")              # a preset name ...
    arch = load_arch("path/config.json")   # ... or any Llama/Qwen2/DeepSeek config
    arch.num_layers, arch.hidden, arch.num_heads, arch.num_kv_heads, arch.head_dim,
    arch.vocab, arch.intermediate, arch.tie_embeddings
    arch.n_routed_experts, arch.n_shared_experts, arch.experts_per_token,
    arch.moe_intermediate, arch.first_dense_layers, arch.moe_layer_freq
    arch.q_lora_rank, arch.kv_lora_rank, arch.qk_nope_head_dim, arch.qk_rope_head_dim,
    arch.v_head_dim, arch.index_n_heads, arch.index_head_dim, arch.index_topk
    arch.is_mla, arch.is_moe, arch.is_sparse, arch.num_moe_layers, arch.num_dense_layers
    arch.params() -> ParamCounts(attention, dense_mlp, routed_experts, shared_experts,
                                 router, embeddings, norms, active_per_token; .total)
    arch.attention_params_per_layer() -> int
    arch.kv_bytes_per_token(dtype_bytes)   # MLA: L*(kv_lora+rope); GQA: L*2*n_kv*hd
    arch.index_bytes_per_token(dtype_bytes)  # V3.2 indexer keys (0 otherwise)
    arch.prefill_flops_per_token()         # linear part, 2 * active non-embedding
    arch.attention_flops(cached, new)      # causal, all layers (sparse-aware)

Counts are elements, computed from the config's shapes; a multi-token-prediction
layer (num_nextn_predict_layers) is not counted. Owns no hardware assumptions.
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from dualpath.presets.arch import ArchConfigError, ModelArch, from_config
from dualpath.presets.counts import ParamCounts

__all__ = ["ArchConfigError", "ModelArch", "ParamCounts", "load_arch", "load_config",
           "preset_names"]


def preset_names() -> list[str]:
    """Names of the shipped presets (file stems), sorted."""
    files = resources.files(__name__).iterdir()
    return sorted(f.name[:-5] for f in files if f.name.endswith(".json"))


def load_config(name_or_path: str) -> tuple[str, dict]:
    """(name, raw config dict) for a preset name or a path to a config.json."""
    if name_or_path in preset_names():
        text = resources.files(__name__).joinpath(f"{name_or_path}.json").read_text()
        return name_or_path, json.loads(text)
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ArchConfigError(name_or_path, "model",
                          f"not a preset ({', '.join(preset_names())}) nor a config.json file")
    try:
        return path.parent.name or path.stem, json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ArchConfigError(str(path), "json", str(exc)) from exc


def load_arch(name_or_path: str) -> ModelArch:
    """The ModelArch of a preset name or a config.json path (see module docstring)."""
    name, cfg = load_config(name_or_path)
    if not isinstance(cfg, dict):
        raise ArchConfigError(name, "json", "top level must be an object")
    return from_config(cfg, name)
