"""Reading a DeepSeek-V3 checkpoint directory (config.json + *.safetensors, HF layout).

FP8 weights are dequantized on load; layers past num_hidden_layers (MTP) are skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from shared.model.config import ModelConfig
from shared.model.deepseek_shapes import IndexerShape, MLAShape, MoEShape, YarnScaling
from shared.model.weights_hf import UnsupportedCheckpoint

DEEPSEEK_TYPES = ("deepseek_v3", "deepseek_v32")  # v32 adds the sparse-attention indexer
_FP8 = (torch.float8_e4m3fn,)


def is_deepseek(directory: str) -> bool:
    c = json.loads((Path(directory) / "config.json").read_text())
    return c.get("model_type") in DEEPSEEK_TYPES


def deepseek_config(c: dict, *, name: str, eos_ids: tuple[int, ...] = (), dtype: str = "float32") -> ModelConfig:
    """A DeepSeek-V3-style config.json dict as a ModelConfig; refuses what the model cannot run."""
    _refuse_unless(c, name, "topk_method", "noaux_tc")
    _refuse_unless(c, name, "scoring_func", "sigmoid")
    heads = c["num_attention_heads"]
    mla = MLAShape(q_lora_rank=c.get("q_lora_rank") or 0, kv_lora_rank=c["kv_lora_rank"],
                   qk_nope_head_dim=c["qk_nope_head_dim"], qk_rope_head_dim=c["qk_rope_head_dim"],
                   v_head_dim=c["v_head_dim"])
    moe = None
    if c.get("n_routed_experts"):
        moe = MoEShape(n_routed_experts=c["n_routed_experts"], n_shared_experts=c.get("n_shared_experts") or 0,
                       experts_per_token=c["num_experts_per_tok"], moe_intermediate_size=c["moe_intermediate_size"],
                       first_k_dense_replace=c.get("first_k_dense_replace", 0),
                       moe_layer_freq=c.get("moe_layer_freq", 1), n_group=c.get("n_group") or 1,
                       topk_group=c.get("topk_group") or 1,
                       routed_scaling_factor=float(c.get("routed_scaling_factor", 1.0)),
                       norm_topk_prob=bool(c.get("norm_topk_prob", True)))
    return ModelConfig(
        name=name, arch="deepseek_v3", vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
        intermediate_size=c["intermediate_size"], n_layers=c["num_hidden_layers"], n_heads=heads,
        n_kv_heads=c.get("num_key_value_heads") or heads, head_dim=c["v_head_dim"],
        rope_theta=float(c.get("rope_theta", 10000.0)), rms_eps=float(c.get("rms_norm_eps", 1e-6)),
        max_position=c.get("max_position_embeddings", 4096), tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        bos_id=c.get("bos_token_id"), eos_ids=eos_ids, dtype=dtype, mla=mla, moe=moe, yarn=_yarn(c, name),
        indexer=_indexer(c, mla),
    )


def _indexer(c: dict, mla: MLAShape) -> IndexerShape | None:
    if not c.get("index_topk"):
        return None
    return IndexerShape(n_heads=c["index_n_heads"], head_dim=c["index_head_dim"], topk=c["index_topk"],
                        rope_dim=mla.qk_rope_head_dim)


def _refuse_unless(c: dict, name: str, key: str, want: str) -> None:
    if c.get(key, want) != want:
        raise UnsupportedCheckpoint(name, f"{key} {c[key]!r} not supported (only {want!r})")


def _yarn(c: dict, name: str) -> YarnScaling | None:
    rs = c.get("rope_scaling")
    if not rs:
        return None
    if rs.get("type", rs.get("rope_type")) != "yarn":
        raise UnsupportedCheckpoint(name, f"rope_scaling {rs} not supported (only yarn)")
    return YarnScaling(factor=float(rs["factor"]), original_max_position=int(rs["original_max_position_embeddings"]),
                       beta_fast=float(rs.get("beta_fast", 32)), beta_slow=float(rs.get("beta_slow", 1)),
                       mscale=float(rs.get("mscale", 1)), mscale_all_dim=float(rs.get("mscale_all_dim", 0)))


def dequantize_fp8(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """fp8 (out, in) times the float32 scale of its (bo, bi) block -> float32 (out, in)."""
    out_dim, in_dim = weight.shape
    want = (-(-out_dim // block[0]), -(-in_dim // block[1]))
    if tuple(scale_inv.shape) != want:
        raise ValueError(f"scale_inv {tuple(scale_inv.shape)} does not tile weight {(out_dim, in_dim)} by {block}")
    s = scale_inv.float().repeat_interleave(block[0], 0)[:out_dim].repeat_interleave(block[1], 1)[:, :in_dim]
    return weight.float() * s


def load_deepseek(directory: str, *, eos_ids: tuple[int, ...],
                  dtype: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    c = json.loads((Path(directory) / "config.json").read_text())
    cfg = deepseek_config(c, name=c.get("_name_or_path") or Path(directory).name, eos_ids=eos_ids, dtype=dtype)
    block = tuple((c.get("quantization_config") or {}).get("weight_block_size", (128, 128)))
    raw: dict[str, torch.Tensor] = {}
    shards = sorted(Path(directory).glob("*.safetensors"))
    if not shards:
        raise UnsupportedCheckpoint(directory, "no *.safetensors files")
    for shard in shards:
        raw.update(load_file(str(shard)))
    out: dict[str, torch.Tensor] = {}
    for name, t in raw.items():
        ours = name.removeprefix("model.")
        if name.endswith("_scale_inv") or ours.endswith("rotary_emb.inv_freq") or _beyond(ours, cfg.n_layers):
            continue
        if t.dtype in _FP8:
            if name + "_scale_inv" not in raw:
                raise UnsupportedCheckpoint(directory, f"{name} is FP8 without {name}_scale_inv")
            t = dequantize_fp8(t, raw[name + "_scale_inv"], block)
        out[ours] = t.to(getattr(torch, dtype))
    return cfg, out


def _beyond(name: str, n_layers: int) -> bool:
    parts = name.split(".")
    return parts[0] == "layers" and int(parts[1]) >= n_layers


def deepseek_config_json(cfg: ModelConfig) -> dict:
    m, e = cfg.mla, cfg.moe
    out = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": cfg.vocab_size,
           "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
           "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
           "num_key_value_heads": cfg.n_kv_heads, "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.rms_eps,
           "max_position_embeddings": cfg.max_position, "tie_word_embeddings": cfg.tie_embeddings,
           "bos_token_id": cfg.bos_id, "q_lora_rank": m.q_lora_rank or None, "kv_lora_rank": m.kv_lora_rank,
           "qk_nope_head_dim": m.qk_nope_head_dim, "qk_rope_head_dim": m.qk_rope_head_dim,
           "v_head_dim": m.v_head_dim, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "rope_scaling": None}
    if e is not None:
        out.update(n_routed_experts=e.n_routed_experts, n_shared_experts=e.n_shared_experts,
                   num_experts_per_tok=e.experts_per_token, moe_intermediate_size=e.moe_intermediate_size,
                   first_k_dense_replace=e.first_k_dense_replace, moe_layer_freq=e.moe_layer_freq,
                   n_group=e.n_group, topk_group=e.topk_group, routed_scaling_factor=e.routed_scaling_factor,
                   norm_topk_prob=e.norm_topk_prob)
    if cfg.indexer is not None:
        ix = cfg.indexer
        out.update(model_type="deepseek_v32", architectures=["DeepseekV32ForCausalLM"], index_n_heads=ix.n_heads,
                   index_head_dim=ix.head_dim, index_topk=ix.topk)
    if cfg.yarn is not None:
        y = cfg.yarn
        out["rope_scaling"] = {"type": "yarn", "factor": y.factor, "original_max_position_embeddings":
                               y.original_max_position, "beta_fast": y.beta_fast, "beta_slow": y.beta_slow,
                               "mscale": y.mscale, "mscale_all_dim": y.mscale_all_dim}
    return out
