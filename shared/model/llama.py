"""The Llama-style decoder (GQA, RoPE, RMSNorm, SwiGLU, optional tied embeddings)."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from shared.model.attention import StepIndex, paged_attention, reference_attention, write_kv
from shared.model.batch import ForwardBatch, SeqSlice
from shared.model.config import ModelConfig
from shared.model.kv_cache import PagedKVCache, torch_dtype

__all__ = ["ForwardBatch", "LayerHooks", "Llama", "SeqSlice"]


class LayerHooks(Protocol):
    """Per-layer callbacks of one forward step; both may block. before_layer(l) runs before layer l
    reads the cache, after_layer(l) once its new K/V are in it."""

    def before_layer(self, layer: int) -> None:
        return None

    def after_layer(self, layer: int) -> None:
        return None


class Linear(nn.Linear):
    """nn.Linear that allocates without initializing: every loader fills all weights."""

    def reset_parameters(self) -> None:
        return None


class Embedding(nn.Embedding):
    def reset_parameters(self) -> None:
        return None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, D) -> (N, D)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin of shape (N, 1, hd) for the rotate-half (HF) RoPE convention."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # (N, hd/2)
    angles = torch.cat([angles, angles], dim=-1)[:, None, :]  # (N, 1, hd)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (N, h, hd) by position: pairs are (i, i + hd/2)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, device=None) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        d, q_dim, kv_dim, b = cfg.hidden_size, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.attn_bias
        self.q_proj = Linear(d, q_dim, bias=b, device=device)
        self.k_proj = Linear(d, kv_dim, bias=b, device=device)
        self.v_proj = Linear(d, kv_dim, bias=b, device=device)
        self.o_proj = Linear(q_dim, d, bias=False, device=device)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.n_heads, self.hd)
        k = self.k_proj(x).view(n, self.n_kv, self.hd)
        v = self.v_proj(x).view(n, self.n_kv, self.hd)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def out(self, o: torch.Tensor) -> torch.Tensor:  # (N, nh, hd) -> (N, D)
        return self.o_proj(o.reshape(o.shape[0], -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, device=None) -> None:
        super().__init__()
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = Linear(d, f, bias=False, device=device)
        self.up_proj = Linear(d, f, bias=False, device=device)
        self.down_proj = Linear(f, d, bias=False, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, D) -> (N, D)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, device=None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps, device)
        self.self_attn = Attention(cfg, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps, device)
        self.mlp = MLP(cfg, device)


class Llama(nn.Module):
    def __init__(self, cfg: ModelConfig, device: str | torch.device | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.embed_tokens = Embedding(cfg.vocab_size, d, device=device)
        self.layers = nn.ModuleList(LlamaBlock(cfg, device) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(d, cfg.rms_eps, device)
        self.lm_head = None if cfg.tie_embeddings else Linear(d, cfg.vocab_size, bias=False, device=device)

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.cfg.dtype)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: PagedKVCache, hooks: LayerHooks | None = None) -> torch.Tensor:
        """Compute the batch's new tokens into `kv`; logits (n_seqs, vocab) float32 of each last token."""
        if isinstance(batch, list):
            batch = ForwardBatch(batch)
        self._check_cache(kv)
        idx = StepIndex.build(batch, kv.block_size, kv.data.device)
        cos, sin = rope_cos_sin(idx.positions, self.cfg.head_dim, self.cfg.rope_theta, self.dtype)
        x = self.embed_tokens(idx.tokens)  # (N, D)
        for i, block in enumerate(self.layers):
            if hooks is not None:
                hooks.before_layer(i)
            layer_kv, li = idx.layer(kv, i)  # (num_blocks, 2, bs, n_kv, hd): layer i (or every Layer Block)
            q, k, v = block.self_attn.qkv(block.input_layernorm(x), cos, sin)
            write_kv(layer_kv, li, k, v)
            if hooks is not None:
                hooks.after_layer(i)
            x = x + block.self_attn.out(paged_attention(q, k, v, layer_kv, li))
            x = x + block.mlp(block.post_attention_layernorm(x))
        return self._logits(x[idx.last_index])

    @torch.inference_mode()
    def forward_reference(self, token_ids: list[int]) -> torch.Tensor:
        """Full causal pass over token_ids with no cache; logits (T, vocab) float32."""
        dev = self.embed_tokens.weight.device
        tokens = torch.tensor(token_ids, dtype=torch.long, device=dev)
        cos, sin = rope_cos_sin(torch.arange(len(token_ids), device=dev), self.cfg.head_dim, self.cfg.rope_theta,
                                self.dtype)
        x = self.embed_tokens(tokens)  # (T, D)
        for block in self.layers:
            q, k, v = block.self_attn.qkv(block.input_layernorm(x), cos, sin)
            x = x + block.self_attn.out(reference_attention(q, k, v))
            x = x + block.mlp(block.post_attention_layernorm(x))
        return self._logits(x)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:  # (n, D) -> (n, vocab)
        h = self.norm(x)
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, weight).float()

    def _check_cache(self, kv: PagedKVCache) -> None:
        c = self.cfg
        want = (c.n_layers, 2, kv.block_size, c.n_kv_heads, c.head_dim)
        if tuple(kv.data.shape[1:]) != want or kv.data.dtype != self.dtype:
            raise ValueError(f"cache {tuple(kv.data.shape)} {kv.data.dtype} does not fit model {want} {self.dtype}")
