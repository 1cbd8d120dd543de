"""Multi-head latent attention (DeepSeek-V2/V3) over the paged cache, and its naive oracle.

Prefill attends expanded (K and V up-projected), decode absorbed (straight over the latent rows).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.paged_mla import gather_rows, paged_mla_decode
from shared.model.attention import StepIndex
from shared.model.config import ModelConfig
from shared.model.deepseek_rope import rope_interleaved, yarn_mscale
from shared.model.indexer import Indexer
from shared.model.llama import Linear, RMSNorm


def softmax_scale(cfg: ModelConfig) -> float:
    s = cfg.mla.qk_head_dim ** -0.5
    if cfg.yarn is not None and cfg.yarn.mscale_all_dim:
        s *= yarn_mscale(cfg.yarn.factor, cfg.yarn.mscale_all_dim) ** 2
    return s


def read_rows(layer_kv: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    return gather_rows(layer_kv, blocks)


class MLAttention(nn.Module):
    """The projections; HF DeepSeek-V3 parameter names (self_attn.*)."""

    def __init__(self, cfg: ModelConfig, device=None) -> None:
        super().__init__()
        m, d, h = cfg.mla, cfg.hidden_size, cfg.n_heads
        self.h, self.nope, self.rope = h, m.qk_nope_head_dim, m.qk_rope_head_dim
        self.v, self.c = m.v_head_dim, m.kv_lora_rank
        if m.q_lora_rank:
            self.q_a_proj = Linear(d, m.q_lora_rank, bias=False, device=device)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, cfg.rms_eps, device)
            self.q_b_proj = Linear(m.q_lora_rank, h * m.qk_head_dim, bias=False, device=device)
        else:
            self.q_proj = Linear(d, h * m.qk_head_dim, bias=False, device=device)
        self.kv_a_proj_with_mqa = Linear(d, m.latent_width, bias=False, device=device)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, cfg.rms_eps, device)
        self.kv_b_proj = Linear(m.kv_lora_rank, h * (m.qk_nope_head_dim + m.v_head_dim), bias=False, device=device)
        self.o_proj = Linear(h * m.v_head_dim, d, bias=False, device=device)
        self.scale = softmax_scale(cfg)
        self.indexer = Indexer(cfg, m.q_lora_rank or d, device) if cfg.indexer is not None else None

    def _q_input(self, x: torch.Tensor) -> torch.Tensor:
        return self.q_a_layernorm(self.q_a_proj(x)) if hasattr(self, "q_b_proj") else x

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        q_in = self._q_input(x)
        q = self.q_b_proj(q_in) if hasattr(self, "q_b_proj") else self.q_proj(q_in)
        q = q.view(x.shape[0], self.h, self.nope + self.rope)
        return q[..., : self.nope], rope_interleaved(q[..., self.nope :], cos, sin)

    def index_queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return None if self.indexer is None else self.indexer.queries(x, self._q_input(x), cos, sin)

    def latent(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """(N, D) -> cache rows (N, W): normed c_kv, roped k_pe, then (V3.2) the indexer key."""
        a = self.kv_a_proj_with_mqa(x)
        k_pe = rope_interleaved(a[:, None, self.c :], cos, sin)[:, 0]
        parts = [self.kv_a_layernorm(a[:, : self.c]), k_pe]
        if self.indexer is not None:
            parts.append(self.indexer.keys(x, cos, sin))
        return torch.cat(parts, dim=-1)

    def sparse_mask(self, index_q, rows: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        """`causal` (T, S) narrowed to each query's top-k tokens by the indexer (unchanged without one)."""
        if self.indexer is None:
            return causal
        q, w = index_q
        return self.indexer.select(q, w, rows[:, self.c + self.rope :], causal)

    def up_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK (H, nope, c) and W_UV (H, v, c): kv_b_proj split per head."""
        w = self.kv_b_proj.weight.view(self.h, self.nope + self.v, self.c)
        return w[:, : self.nope], w[:, self.nope :]

    def out(self, o: torch.Tensor) -> torch.Tensor:  # (N, H, v) -> (N, D)
        return self.o_proj(o.reshape(o.shape[0], -1))


def expand(attn: MLAttention, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w_uk, w_uv = attn.up_weights()
    c, k_pe = rows[:, : attn.c], rows[:, attn.c : attn.c + attn.rope]
    k_nope = torch.einsum("sc,hdc->shd", c, w_uk)
    k = torch.cat([k_nope, k_pe[:, None, :].expand(-1, attn.h, -1)], dim=-1)
    return k, torch.einsum("sc,hvc->shv", c, w_uv)


def attend_expanded(attn: MLAttention, q_nope, q_pe, rows, mask: torch.Tensor | None) -> torch.Tensor:
    """Up-projected attention of T queries over S rows; mask (T, S) bool or None (causal, T == S)."""
    k, v = expand(attn, rows)
    q = torch.cat([q_nope, q_pe], dim=-1).transpose(0, 1)  # (H, T, qk)
    o = F.scaled_dot_product_attention(q[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       attn_mask=mask, is_causal=mask is None, scale=attn.scale)
    return o[0].transpose(0, 1)  # (T, H, v)


def attend_absorbed(attn: MLAttention, q_nope, q_pe, rows, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Absorbed attention of T queries (N, H, .) over S latent rows (S, W); mask (T, S) or None (all)."""
    w_uk, w_uv = attn.up_weights()
    q = torch.cat([torch.einsum("thd,hdc->thc", q_nope, w_uk), q_pe], dim=-1)  # (T, H, W)
    scores = torch.einsum("thw,sw->ths", q, rows[:, : attn.c + attn.rope]) * attn.scale
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
    o_lat = torch.einsum("ths,sc->thc", scores.softmax(-1), rows[:, : attn.c])  # (T, H, c)
    return torch.einsum("thc,hvc->thv", o_lat, w_uv)


def naive_attention(attn: MLAttention, q_nope, q_pe, rows, index_q=None) -> torch.Tensor:
    """The oracle: K and V materialised, explicit causal (and top-k) softmax -> (T, H, v)."""
    k, v = expand(attn, rows)
    q = torch.cat([q_nope, q_pe], dim=-1)
    scores = torch.einsum("thd,shd->hts", q, k) * attn.scale
    t = q.shape[0]
    allowed = attn.sparse_mask(index_q, rows, torch.ones(t, t, dtype=torch.bool, device=q.device).tril())
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hts,shv->thv", scores.softmax(-1), v)


def write_rows(layer_kv: torch.Tensor, idx: StepIndex, rows: torch.Tensor) -> None:
    half = rows.shape[-1] // 2  # each row split over the planes: a one-plane corruption mixes rows, visibly
    layer_kv[:, 0][idx.write_blocks, idx.write_rows, 0] = rows[:, :half]
    layer_kv[:, 1][idx.write_blocks, idx.write_rows, 0] = rows[:, half:]


def paged_mla(attn: MLAttention, q_nope, q_pe, new_rows, layer_kv: torch.Tensor, idx: StepIndex,
              index_q=None) -> torch.Tensor:
    """Causal MLA of the step's new tokens over the cache (their rows already written) -> (N, H, v)."""
    out = q_nope.new_empty(q_nope.shape[0], attn.h, attn.v)
    if idx.decode is not None:
        out[idx.decode.rows] = _decode(attn, q_nope, q_pe, layer_kv, idx.decode, index_q)
    for p in idx.prefills:
        sl = slice(p.first, p.first + p.count)
        rows = new_rows[sl] if p.mask is None else read_rows(layer_kv, p.table)[: p.start_pos + p.count]
        mask = p.mask
        if attn.indexer is not None:
            causal = p.mask if p.mask is not None else torch.ones(p.count, p.count, dtype=torch.bool,
                                                                  device=rows.device).tril()
            mask = attn.sparse_mask(_rows_of(index_q, p.first, p.first + p.count), rows, causal)
        out[sl] = attend_expanded(attn, q_nope[sl], q_pe[sl], rows, mask)
    return out


def _decode(attn: MLAttention, q_nope, q_pe, layer_kv: torch.Tensor, g, index_q) -> torch.Tensor:
    w_uk, w_uv = attn.up_weights()
    q = torch.cat([torch.einsum("bhd,hdc->bhc", q_nope[g.rows], w_uk), q_pe[g.rows]], dim=-1)  # (B, H, c + rope)
    masks = None
    if attn.indexer is not None:  # V3.2: each query's top-k context tokens, from the index keys in its rows
        masks = []
        for i, (table, length) in enumerate(zip(g.tables, g.lens)):
            rows = read_rows(layer_kv, table)[:length]
            full = torch.ones(1, length, dtype=torch.bool, device=rows.device)
            row = int(g.rows[i])
            masks.append(attn.sparse_mask(_rows_of(index_q, row, row + 1), rows, full)[0])
    o_lat = paged_mla_decode(q, layer_kv, g.tables, g.lens, values=attn.c, scale=attn.scale, masks=masks)
    return torch.einsum("bhc,hvc->bhv", o_lat, w_uv)


def _rows_of(index_q, start: int, stop: int):
    q, w = index_q
    return q[start:stop], w[start:stop]
