"""DeepSeek-V3 feed-forward layers: the SwiGLU MLP, and the MoE with `noaux_tc` routing."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shared.model.deepseek_shapes import MoEShape
from shared.model.llama import Linear


class SwiGLU(nn.Module):
    def __init__(self, d: int, f: int, device=None) -> None:
        super().__init__()
        self.gate_proj = Linear(d, f, bias=False, device=device)
        self.up_proj = Linear(d, f, bias=False, device=device)
        self.down_proj = Linear(f, d, bias=False, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, D) -> (N, D)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, d: int, shape: MoEShape, device=None) -> None:
        super().__init__()
        self.shape = shape
        self.weight = nn.Parameter(torch.empty(shape.n_routed_experts, d, device=device))
        self.e_score_correction_bias = nn.Parameter(torch.empty(shape.n_routed_experts, device=device))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return route(x, self.weight, self.e_score_correction_bias, self.shape)


def route(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, s: MoEShape):
    """(N, D) -> expert ids (N, k) and weights (N, k) float32 by V3's `noaux_tc` rule: biased sigmoid
    scores choose (the topk_group groups best by their top-2 sum, then the top k), unbiased ones weigh."""
    scores = F.linear(x.float(), weight.float()).sigmoid()  # (N, E)
    choice = scores + bias.float()
    n = x.shape[0]
    grouped = choice.view(n, s.n_group, -1)  # (N, G, E/G)
    merit = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)  # (N, G)
    keep = torch.zeros_like(merit, dtype=torch.bool).scatter_(1, merit.topk(s.topk_group, dim=-1).indices, True)
    choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(n, -1)
    ids = choice.topk(s.experts_per_token, dim=-1).indices  # (N, k)
    w = scores.gather(1, ids)
    if s.norm_topk_prob:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return ids, w * s.routed_scaling_factor


class MoE(nn.Module):
    def __init__(self, d: int, shape: MoEShape, device=None) -> None:
        super().__init__()
        f = shape.moe_intermediate_size
        self.gate = Router(d, shape, device)
        self.experts = nn.ModuleList(SwiGLU(d, f, device) for _ in range(shape.n_routed_experts))
        self.shared_experts = SwiGLU(d, f * shape.n_shared_experts, device) if shape.n_shared_experts else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, D) -> (N, D)
        ids, w = self.gate(x)
        out = torch.zeros_like(x, dtype=torch.float32)
        for e in ids.unique().tolist():
            tok, slot = (ids == e).nonzero(as_tuple=True)
            out.index_add_(0, tok, self.experts[e](x[tok]).float() * w[tok, slot, None])
        out = out.to(x.dtype)
        return out if self.shared_experts is None else out + self.shared_experts(x)
