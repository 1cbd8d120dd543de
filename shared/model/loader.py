"""load_model(spec): a ready-to-run model (Llama or DeepSeekV3), its tokenizer, config and id."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from shared.model import tokenizer_build
from shared.model.config import ModelConfig
from shared.model.deepseek import DeepSeekV3
from shared.model.deepseek_shapes import MLAShape, MoEShape
from shared.model.llama import Llama
from shared.model.random_init import random_state
from shared.model.specs import resolve_spec
from shared.model.tokenizer import Tokenizer

# The tiny preset's weights rule has a version: a store written under another rule never
# serves this one's blocks (the model id is part of every block's fingerprint).
TINY_ID = "tiny2"
TINY_MLA_ID = "tiny-mla1"


@dataclass(frozen=True)
class LoadedModel:
    model: Llama | DeepSeekV3
    tokenizer: Tokenizer
    config: ModelConfig
    model_id: str  # stable name of these exact weights (e.g. "tiny2@seed0")


def tiny_config(tok: Tokenizer, dtype: str = "float32", **overrides) -> ModelConfig:
    """The tiny shape (4 layers, hidden 128, 4 heads, 2 KV heads, untied output rows) over the byte tokenizer."""
    base = dict(name="tiny", vocab_size=tok.vocab_size, bos_id=tok.bos_id, eos_ids=tok.eos_ids, dtype=dtype,
                tie_embeddings=False)
    return ModelConfig(**{**base, **overrides})


def tiny_mla_config(tok: Tokenizer, dtype: str = "float32") -> ModelConfig:
    mla = MLAShape(q_lora_rank=48, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32)
    moe = MoEShape(n_routed_experts=8, n_shared_experts=1, experts_per_token=2, moe_intermediate_size=64,
                   first_k_dense_replace=1, n_group=4, topk_group=2, routed_scaling_factor=2.5)
    return ModelConfig(name="tiny-mla", arch="deepseek_v3", vocab_size=tok.vocab_size, hidden_size=128,
                       intermediate_size=256, n_layers=3, n_heads=4, n_kv_heads=4, head_dim=32,
                       tie_embeddings=False, bos_id=tok.bos_id, eos_ids=tok.eos_ids, dtype=dtype,
                       mla=mla, moe=moe)


def random_model(cfg: ModelConfig, seed: int = 0) -> Llama | DeepSeekV3:
    model = _empty_model(cfg)
    state = random_state(model, cfg, seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(state[name])
    return _finish(model)


def _empty_model(cfg: ModelConfig) -> Llama | DeepSeekV3:
    # Built on CPU, not "meta": meta init pulls in torch's symbolic machinery (~1 s).
    cls = DeepSeekV3 if cfg.arch == "deepseek_v3" else Llama
    return cls(cfg).to(getattr(torch, cfg.dtype))


def _finish(model: Llama | DeepSeekV3) -> Llama | DeepSeekV3:
    model.eval()
    model.requires_grad_(False)
    return model


def _from_state(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> Llama | DeepSeekV3:
    model = _empty_model(cfg)
    model.load_state_dict(state, strict=True, assign=True)
    return _finish(model)


def _random_spec(arg: str, seed: int, dtype: str) -> LoadedModel:
    shape = json.loads(arg or "{}")
    if "eos_ids" in shape:
        shape["eos_ids"] = tuple(shape["eos_ids"])
    tok = tokenizer_build.tiny_tokenizer()
    cfg = tiny_config(tok, dtype, **{"name": "random", **shape})
    if cfg.vocab_size < tok.vocab_size:
        raise ValueError(f"vocab_size {cfg.vocab_size} < tokenizer's {tok.vocab_size}")
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode()).hexdigest()[:12]
    return LoadedModel(random_model(cfg, seed), tok, cfg, f"random-{digest}@seed{seed}")


def load_model(spec: str, *, seed: int = 0, dtype: str = "float32", device: str = "cpu") -> LoadedModel:
    """The model named by `spec`, built on the host (same weights on every device), then moved to `device`."""
    loaded = _load(spec, seed, dtype)
    if device != "cpu":
        loaded.model.to(device)
    return loaded


def _load(spec: str, seed: int, dtype: str) -> LoadedModel:
    kind, arg = resolve_spec(spec)
    if kind in ("tiny", "tiny-mla"):
        tok = tokenizer_build.tiny_tokenizer()
        cfg = tiny_config(tok, dtype) if kind == "tiny" else tiny_mla_config(tok, dtype)
        weights_rule = TINY_ID if kind == "tiny" else TINY_MLA_ID
        return LoadedModel(random_model(cfg, seed), tok, cfg, f"{weights_rule}@seed{seed}")
    if kind == "random":
        return _random_spec(arg, seed, dtype)
    if kind == "gguf":
        return _load_gguf(arg, dtype)
    return _load_hf(arg, dtype)


def _load_gguf(path: str, dtype: str) -> LoadedModel:
    from shared.model.weights_gguf import gguf_config, gguf_state_dict, open_gguf

    tok = tokenizer_build.gguf_tokenizer(path, open_gguf(path))
    cfg = gguf_config(path, eos_ids=tok.eos_ids, dtype=dtype)
    model = _from_state(cfg, gguf_state_dict(path, cfg))
    return LoadedModel(model, tok, cfg, Path(path).name.split(".")[0])


def _load_hf(directory: str, dtype: str) -> LoadedModel:
    from shared.model.weights_deepseek import is_deepseek, load_deepseek
    from shared.model.weights_hf import hf_config, hf_state_dict

    if is_deepseek(directory):
        tok = tokenizer_build.hf_tokenizer(directory)
        cfg, state = load_deepseek(directory, eos_ids=tok.eos_ids, dtype=dtype)
        return LoadedModel(_from_state(cfg, state), tok, cfg, Path(directory).resolve().name)
    tok = tokenizer_build.hf_tokenizer(directory)
    cfg = hf_config(directory, eos_ids=tok.eos_ids, dtype=dtype)
    model = _from_state(cfg, hf_state_dict(directory, cfg))
    return LoadedModel(model, tok, cfg, Path(directory).resolve().name)
