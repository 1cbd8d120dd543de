"""load_model(spec): a ready-to-run Llama, its tokenizer, config and model id.

Owns turning a model spec (see specs.py) into weights: random init from a seed (tiny
and `random:<json>`), GGUF (weights_gguf.py) or an HF directory (weights_hf.py). The
model id names the weights exactly (file name, or shape + seed), so KV-block
fingerprints built from it never mix two models' caches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from shared.model import tokenizer_build
from shared.model.config import ModelConfig
from shared.model.llama import Llama
from shared.model.random_init import random_state
from shared.model.specs import resolve_spec
from shared.model.tokenizer import Tokenizer

# The tiny preset's weights rule has a version: a store written under another rule never
# serves this one's blocks (the model id is part of every block's fingerprint).
TINY_ID = "tiny2"


@dataclass(frozen=True)
class LoadedModel:
    model: Llama
    tokenizer: Tokenizer
    config: ModelConfig
    model_id: str  # stable name of these exact weights (e.g. "tiny2@seed0")


def tiny_config(tok: Tokenizer, dtype: str = "float32", **overrides) -> ModelConfig:
    """The tiny shape (4 layers, hidden 128, 4 heads, 2 KV heads, untied output rows) over the byte tokenizer."""
    base = dict(name="tiny", vocab_size=tok.vocab_size, bos_id=tok.bos_id, eos_ids=tok.eos_ids, dtype=dtype,
                tie_embeddings=False)
    return ModelConfig(**{**base, **overrides})


def random_model(cfg: ModelConfig, seed: int = 0) -> Llama:
    """A Llama of shape cfg with weights drawn from `seed` only (same seed, same weights, in
    any process), by the context-sensitive rule of random_init.py."""
    model = _empty_model(cfg)
    state = random_state(model, cfg, seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(state[name])
    return _finish(model)


def _empty_model(cfg: ModelConfig) -> Llama:
    # Built on CPU, not "meta": meta init pulls in torch's symbolic machinery (~1 s).
    return Llama(cfg).to(getattr(torch, cfg.dtype))


def _finish(model: Llama) -> Llama:
    model.eval()
    model.requires_grad_(False)
    return model


def _from_state(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> Llama:
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


def load_model(spec: str, *, seed: int = 0, dtype: str = "float32") -> LoadedModel:
    """Load the model named by spec (tiny | random:<json> | smollm2 | *.gguf | HF dir)."""
    kind, arg = resolve_spec(spec)
    if kind == "tiny":
        tok = tokenizer_build.tiny_tokenizer()
        cfg = tiny_config(tok, dtype)
        return LoadedModel(random_model(cfg, seed), tok, cfg, f"{TINY_ID}@seed{seed}")
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
    from shared.model.weights_hf import hf_config, hf_state_dict

    tok = tokenizer_build.hf_tokenizer(directory)
    cfg = hf_config(directory, eos_ids=tok.eos_ids, dtype=dtype)
    model = _from_state(cfg, hf_state_dict(directory, cfg))
    return LoadedModel(model, tok, cfg, Path(directory).resolve().name)
