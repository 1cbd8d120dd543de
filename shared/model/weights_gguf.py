"""Reading a GGUF file into a ModelConfig and an HF-named float state dict.

llama.cpp's Q/K row permutation is undone for llama GGUFs, so one RoPE serves GGUF and HF weights.
"""

from __future__ import annotations

from functools import lru_cache

import gguf
import numpy as np
import torch
from gguf.quants import dequantize

from shared.model.config import ModelConfig

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
_SUPPORTED_ARCHS = ("llama", "qwen2")


class UnsupportedGGUF(ValueError):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


@lru_cache(maxsize=2)
def open_gguf(path: str) -> gguf.GGUFReader:
    """One (memory-mapped) reader per file per process; parsing the metadata takes seconds."""
    return gguf.GGUFReader(path)


def _meta(r: gguf.GGUFReader, key: str, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def gguf_config(path: str, *, eos_ids: tuple[int, ...], dtype: str) -> ModelConfig:
    r = open_gguf(path)
    arch = _meta(r, "general.architecture")
    if arch not in _SUPPORTED_ARCHS:
        raise UnsupportedGGUF(path, f"architecture {arch!r} not in {_SUPPORTED_ARCHS}")
    m = lambda key, default=None: _meta(r, f"{arch}.{key}", default)  # noqa: E731
    hidden, n_heads = m("embedding_length"), m("attention.head_count")
    names = {t.name for t in r.tensors}
    return ModelConfig(
        name=_meta(r, "general.name", arch),
        vocab_size=m("vocab_size") or len(_meta(r, "tokenizer.ggml.tokens")),
        hidden_size=hidden,
        intermediate_size=m("feed_forward_length"),
        n_layers=m("block_count"),
        n_heads=n_heads,
        n_kv_heads=m("attention.head_count_kv", n_heads),
        head_dim=m("attention.key_length", hidden // n_heads),
        rope_theta=float(m("rope.freq_base", 10000.0)),
        rms_eps=float(m("attention.layer_norm_rms_epsilon", 1e-5)),
        max_position=m("context_length"),
        tie_embeddings="output.weight" not in names,
        attn_bias="blk.0.attn_q.bias" in names,
        bos_id=_meta(r, "tokenizer.ggml.bos_token_id"),
        eos_ids=eos_ids,
        dtype=dtype,
    )


def _our_name(gguf_name: str) -> str | None:
    """blk.3.attn_q.weight -> layers.3.self_attn.q_proj.weight; None for tensors we skip."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"
    return None


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Invert llama.cpp's per-head (interleaved-pair) row order: (out, ...) -> (out, ...)."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_state_dict(path: str, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    r = open_gguf(path)
    arch = _meta(r, "general.architecture")
    heads = {"attn_q": cfg.n_heads, "attn_k": cfg.n_kv_heads}
    out: dict[str, torch.Tensor] = {}
    for t in r.tensors:
        name = _our_name(t.name)
        if name is None:
            raise UnsupportedGGUF(path, f"unexpected tensor {t.name}")
        w = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)  # owned, writable copy
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        if arch == "llama" and kind in heads:
            w = unpermute_rows(w, heads[kind])
        out[name] = torch.from_numpy(np.ascontiguousarray(w)).to(getattr(torch, cfg.dtype))
    return out
