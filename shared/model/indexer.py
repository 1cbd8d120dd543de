"""DeepSeek-V3.2's lightning indexer: which context tokens each query's MLA attends to.

DeepSeek's FP8 rounding of the index queries and keys is not reproduced.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shared.model.config import ModelConfig
from shared.model.deepseek_rope import rope_half
from shared.model.llama import Linear


class Indexer(nn.Module):
    def __init__(self, cfg: ModelConfig, q_in: int, device=None) -> None:
        super().__init__()
        ix = cfg.indexer
        self.n, self.hd, self.topk, self.rope = ix.n_heads, ix.head_dim, ix.topk, ix.rope_dim
        self.wq_b = Linear(q_in, ix.n_heads * ix.head_dim, bias=False, device=device)
        self.wk = Linear(cfg.hidden_size, ix.head_dim, bias=False, device=device)
        self.k_norm = nn.LayerNorm(ix.head_dim, device=device)
        self.weights_proj = Linear(cfg.hidden_size, ix.n_heads, bias=False, device=device)

    def keys(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        k = self.k_norm(self.wk(x))
        return torch.cat([rope_half(k[:, None, : self.rope], cos, sin)[:, 0], k[:, self.rope :]], dim=-1)

    def queries(self, x: torch.Tensor, q_in: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        q = self.wq_b(q_in).view(x.shape[0], self.n, self.hd)
        q = torch.cat([rope_half(q[..., : self.rope], cos, sin), q[..., self.rope :]], dim=-1)
        return q, self.weights_proj(x) * self.n ** -0.5

    def select(self, q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        """Mask (T, S) bool: for each of T queries, its top-k among the S keys allowed by `causal` (T, S)."""
        scores = torch.einsum("th,ths->ts", w, F.relu(torch.einsum("thd,sd->ths", q, keys))) * self.hd ** -0.5
        scores = scores.masked_fill(~causal, float("-inf"))
        k = min(self.topk, keys.shape[0])
        # a stable sort: equal scores (relu makes exact zeros common) go to the earlier token, so
        # every pass (paged or not, any batch) picks the same set
        picked = scores.sort(dim=-1, descending=True, stable=True).indices[:, :k]
        return torch.zeros_like(causal).scatter_(1, picked, True) & causal
