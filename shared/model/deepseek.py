"""The DeepSeek-V3 decoder: MLA attention (mla.py), dense MLP then MoE layers (moe.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shared.model.attention import StepIndex
from shared.model.batch import ForwardBatch
from shared.model.config import ModelConfig
from shared.model.deepseek_rope import rope_tables
from shared.model.kv_cache import PagedKVCache, torch_dtype
from shared.model.llama import Embedding, LayerHooks, Linear, RMSNorm
from shared.model.mla import MLAttention, naive_attention, paged_mla, write_rows
from shared.model.moe import MoE, SwiGLU


class DeepseekBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, device=None) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.input_layernorm = RMSNorm(d, cfg.rms_eps, device)
        self.self_attn = MLAttention(cfg, device)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_eps, device)
        moe = cfg.moe is not None and cfg.moe.is_moe_layer(layer)
        self.mlp = MoE(d, cfg.moe, device) if moe else SwiGLU(d, cfg.intermediate_size, device)


class DeepSeekV3(nn.Module):
    def __init__(self, cfg: ModelConfig, device: str | torch.device | None = None) -> None:
        super().__init__()
        if cfg.mla is None:
            raise ValueError(f"{cfg.name}: DeepSeekV3 needs an MLA config (arch={cfg.arch!r})")
        self.cfg = cfg
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, device=device)
        self.layers = nn.ModuleList(DeepseekBlock(cfg, i, device) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, device)
        self.lm_head = None if cfg.tie_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, bias=False,
                                                              device=device)

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.cfg.dtype)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: PagedKVCache, hooks: LayerHooks | None = None) -> torch.Tensor:
        if isinstance(batch, list):
            batch = ForwardBatch(batch)
        self._check_cache(kv)
        idx = StepIndex.build(batch, kv.block_size, kv.data.device)
        cos, sin = rope_tables(idx.positions, self.cfg, self.dtype)
        x = self.embed_tokens(idx.tokens)  # (N, D)
        for i, block in enumerate(self.layers):
            if hooks is not None:
                hooks.before_layer(i)
            layer_kv, li = idx.layer(kv, i)  # (num_blocks, 2, bs, 1, W/2): latent rows (or every Layer Block)
            h = block.input_layernorm(x)
            q_nope, q_pe = block.self_attn.queries(h, cos, sin)
            index_q = block.self_attn.index_queries(h, cos, sin)  # None without V3.2's indexer
            rows = block.self_attn.latent(h, cos, sin)  # (N, W)
            write_rows(layer_kv, li, rows)
            if hooks is not None:
                hooks.after_layer(i)
            x = x + block.self_attn.out(paged_mla(block.self_attn, q_nope, q_pe, rows, layer_kv, li, index_q))
            x = x + block.mlp(block.post_attention_layernorm(x))
        return self._logits(x[idx.last_index])

    @torch.inference_mode()
    def forward_reference(self, token_ids: list[int]) -> torch.Tensor:
        dev = self.embed_tokens.weight.device
        cos, sin = rope_tables(torch.arange(len(token_ids), device=dev), self.cfg, self.dtype)
        x = self.embed_tokens(torch.tensor(token_ids, dtype=torch.long, device=dev))
        for block in self.layers:
            h = block.input_layernorm(x)
            q_nope, q_pe = block.self_attn.queries(h, cos, sin)
            rows = block.self_attn.latent(h, cos, sin)
            index_q = block.self_attn.index_queries(h, cos, sin)
            x = x + block.self_attn.out(naive_attention(block.self_attn, q_nope, q_pe, rows, index_q))
            x = x + block.mlp(block.post_attention_layernorm(x))
        return self._logits(x)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(self.norm(x), weight).float()

    def _check_cache(self, kv: PagedKVCache) -> None:
        heads, dim = self.cfg.kv_cache_container
        want = (self.cfg.n_layers, 2, kv.block_size, heads, dim)
        if tuple(kv.data.shape[1:]) != want or kv.data.dtype != self.dtype:
            raise ValueError(f"cache {tuple(kv.data.shape)} {kv.data.dtype} does not fit model {want} {self.dtype}")
