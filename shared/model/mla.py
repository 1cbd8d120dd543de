"""Multi-head latent attention (DeepSeek-V2/V3) over the paged cache, and its naive oracle.

Owns the MLA projections and the three ways to attend:
- **cache rows**: per token per layer the cache keeps one row of width
  W = kv_lora_rank + qk_rope_head_dim: the normed latent c_kv, then the roped key k_pe
  shared by all heads. In the engines' two-plane container ((num_blocks, 2, bs, 1, W/2),
  see kv_geometry.py) a row's first half sits in plane 0 and its second half in plane 1,
  at the token's slot (`write_rows`, `read_rows`). Splitting each row, rather than the
  block, keeps a one-plane corruption visible: attention is blind to whole rows moving
  (their position is baked into k_pe), not to halves of two rows being mixed.
- **expanded** (prefill, chunked prefill): rows are up-projected by kv_b_proj into full
  per-head K (nope + rope) and V, then one SDPA per sequence.
- **absorbed** (decode): W_UK is folded into the query (q_lat = q_nope W_UK, per head) and
  W_UV into the output, so scores and the weighted sum run over the latent rows directly
  (MQA with one shared "head" of width W; values are the first kv_lora_rank columns); a
  decode batch runs ragged straight from the paged cache (kernels.paged_mla).
- **naive** (`naive_attention`): K and V materialised for the whole sequence, explicit
  softmax, no cache: the oracle both others are tested against.

RoPE pairs are interleaved (2i, 2i+1) as in DeepSeek's checkpoints (deepseek_rope.py); YaRN
scaling (cfg.yarn) stretches the frequencies and multiplies the softmax scale by mscale^2.
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
    """Latent rows (len(blocks) * bs, W) of `blocks` from one layer of the two-plane cache,
    (num_blocks, 2, bs, 1, W/2): plane 0 holds each row's first W/2 values, plane 1 the rest."""
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
        """(N, D) -> q_nope (N, H, nope), q_pe (N, H, rope) roped."""
        q_in = self._q_input(x)
        q = self.q_b_proj(q_in) if hasattr(self, "q_b_proj") else self.q_proj(q_in)
        q = q.view(x.shape[0], self.h, self.nope + self.rope)
        return q[..., : self.nope], rope_interleaved(q[..., self.nope :], cos, sin)

    def index_queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """The indexer's queries and head weights for (N, D), or None without an indexer."""
        return None if self.indexer is None else self.indexer.queries(x, self._q_input(x), cos, sin)

    def latent(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """(N, D) -> cache rows (N, W): normed latent c_kv, the roped shared key k_pe, then
        (V3.2) the indexer key."""
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
    """Cache rows (S, W) -> full K (S, H, nope + rope) and V (S, H, v)."""
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
    """The oracle: K/V materialised for all T positions, explicit causal (and, with an indexer,
    top-k) softmax. -> (T, H, v)."""
    k, v = expand(attn, rows)
    q = torch.cat([q_nope, q_pe], dim=-1)
    scores = torch.einsum("thd,shd->hts", q, k) * attn.scale
    t = q.shape[0]
    allowed = attn.sparse_mask(index_q, rows, torch.ones(t, t, dtype=torch.bool, device=q.device).tril())
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hts,shv->thv", scores.softmax(-1), v)


def write_rows(layer_kv: torch.Tensor, idx: StepIndex, rows: torch.Tensor) -> None:
    """Store the new tokens' latent rows (N, W) in their cache slots."""
    half = rows.shape[-1] // 2
    layer_kv[:, 0][idx.write_blocks, idx.write_rows, 0] = rows[:, :half]
    layer_kv[:, 1][idx.write_blocks, idx.write_rows, 0] = rows[:, half:]


def paged_mla(attn: MLAttention, q_nope, q_pe, new_rows, layer_kv: torch.Tensor, idx: StepIndex,
              index_q=None) -> torch.Tensor:
    """Causal MLA of the step's new tokens over the cache (their rows already written) -> (N, H, v).

    One-token sequences (decode) use the absorbed form, multi-token ones the expanded form.
    With an indexer (index_q: its queries and weights for the N tokens) each query attends
    to its top-k tokens only.
    """
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
    """The decode rows, absorbed, in one ragged pass over the paged latent rows (kernels.paged_mla)."""
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
