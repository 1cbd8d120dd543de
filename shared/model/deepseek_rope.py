"""RoPE as DeepSeek-V3 applies it: interleaved pairs (2i, 2i+1), optionally YaRN-scaled."""

from __future__ import annotations

import math

import torch

from shared.model.config import ModelConfig
from shared.model.deepseek_shapes import YarnScaling


def yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_inv_freq(dim: int, theta: float, y: YarnScaling, device=None) -> torch.Tensor:
    exps = torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim
    extra, inter = 1.0 / theta ** exps, 1.0 / (y.factor * theta ** exps)

    def dim_of(rotations: float) -> float:  # the dim index that turns `rotations` times over the trained context
        return dim * math.log(y.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(dim_of(y.beta_fast)), 0)
    high = min(math.ceil(dim_of(y.beta_slow)), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64, device=device) - low) / max(high - low, 1e-3)).clamp(0, 1)
    return inter * ramp + extra * (1 - ramp)


def rope_tables(positions: torch.Tensor, cfg: ModelConfig, dtype: torch.dtype):
    """cos, sin of shape (N, 1, rope/2) for the interleaved-pair RoPE of MLA's rope dims."""
    dim, y = cfg.mla.qk_rope_head_dim, cfg.yarn
    if y is None:
        exps = torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim
        inv_freq, scale = 1.0 / cfg.rope_theta ** exps, 1.0
    else:
        inv_freq = _yarn_inv_freq(dim, cfg.rope_theta, y, positions.device)
        scale = yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim)
    angles = positions.to(torch.float64)[:, None, None] * inv_freq  # (N, 1, rope/2)
    return (angles.cos() * scale).to(dtype), (angles.sin() * scale).to(dtype)


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def rope_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (N, h, rope) by position with pairs (i, i + rope/2): the V3.2 indexer's layout."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
