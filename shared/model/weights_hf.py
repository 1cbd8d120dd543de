"""Reading a Hugging Face checkpoint directory (config.json + *.safetensors) of the Llama family."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from shared.model.config import ModelConfig

_BIASED_TYPES = ("qwen2",)  # model types whose q/k/v projections carry a bias
_SUPPORTED_TYPES = ("llama", "mistral", "qwen2")


class UnsupportedCheckpoint(ValueError):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def hf_config(directory: str, *, eos_ids: tuple[int, ...], dtype: str) -> ModelConfig:
    """config.json as a ModelConfig; rope scaling and other extras are refused."""
    c = json.loads((Path(directory) / "config.json").read_text())
    mtype = c.get("model_type", "llama")
    if mtype not in _SUPPORTED_TYPES:
        raise UnsupportedCheckpoint(directory, f"model_type {mtype!r} not in {_SUPPORTED_TYPES}")
    if c.get("rope_scaling"):
        raise UnsupportedCheckpoint(directory, f"rope_scaling {c['rope_scaling']} not supported")
    n_heads = c["num_attention_heads"]
    return ModelConfig(
        name=c.get("_name_or_path") or Path(directory).name,
        vocab_size=c["vocab_size"],
        hidden_size=c["hidden_size"],
        intermediate_size=c["intermediate_size"],
        n_layers=c["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=c.get("num_key_value_heads") or n_heads,
        head_dim=c.get("head_dim") or c["hidden_size"] // n_heads,
        rope_theta=float(c.get("rope_theta", 10000.0)),
        rms_eps=float(c.get("rms_norm_eps", 1e-6)),
        max_position=c.get("max_position_embeddings", 4096),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        attn_bias=mtype in _BIASED_TYPES or bool(c.get("attention_bias", False)),
        bos_id=c.get("bos_token_id"),
        eos_ids=eos_ids,
        dtype=dtype,
    )


def hf_state_dict(directory: str, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    shards = sorted(Path(directory).glob("*.safetensors"))
    if not shards:
        raise UnsupportedCheckpoint(directory, "no *.safetensors files")
    out: dict[str, torch.Tensor] = {}
    for shard in shards:
        for name, t in load_file(str(shard)).items():
            ours = name.removeprefix("model.")
            if cfg.tie_embeddings and ours == "lm_head.weight":
                continue  # tied: the embedding is the head
            if ours.endswith("rotary_emb.inv_freq"):
                continue  # recomputed from rope_theta
            out[ours] = t.to(getattr(torch, cfg.dtype))
    return out
