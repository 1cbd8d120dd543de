"""Seeded random weights for the `tiny` and `random:` models: cheap, yet context-sensitive.

The next token depends on the context, greedy text is printable and varied and never ends
by itself, and a seed gives the same weights in any process (tests/model/test_tiny_sensitivity.py).
"""
from __future__ import annotations

import torch

from shared.model.config import ModelConfig

QK_GAIN = 2.0  # query/key projection gain: attention between uniform and one-hot
EMBED_SCALE = 1.0  # token embedding entries
HEAD_SCALE = 0.25  # output-row entries (untied): logits of std ~3 over a unit-RMS hidden state
CONST_CHANNEL = 0  # hidden channel that is 1 in every embedding and written by no layer
UNREADABLE_BIAS = -20.0  # output-row weight on CONST_CHANNEL for bytes that are not printable
REPEAT_PENALTY = 0.3  # output rows minus this times the token's own embedding: no runs of one token


def readable_ids(vocab_size: int) -> torch.Tensor:
    """Token ids the tiny byte vocabulary may emit: newline and printable ASCII."""
    ok = torch.zeros(vocab_size, dtype=torch.bool)
    ok[32:127] = True
    ok[10] = True
    return ok


def random_state(model: torch.nn.Module, cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    state = {name: _value(name, p.shape, cfg, gen) for name, p in sorted(model.named_parameters())}
    if "lm_head.weight" in state:  # discourage repeating the token just read (it sits in the residual)
        keep = [c for c in range(cfg.hidden_size) if c != CONST_CHANNEL]
        state["lm_head.weight"][:, keep] -= REPEAT_PENALTY * state["embed_tokens.weight"][:, keep]
    return state


def _value(name: str, shape: torch.Size, cfg: ModelConfig, gen: torch.Generator) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    if name.endswith((".bias", "e_score_correction_bias")):
        return torch.randn(shape, generator=gen) * 0.1
    if name == "embed_tokens.weight":
        v = torch.randn(shape, generator=gen) * EMBED_SCALE
        v[:, CONST_CHANNEL] = 1.0
        return v
    if name == "lm_head.weight":
        v = torch.randn(shape, generator=gen) * HEAD_SCALE
        v[:, CONST_CHANNEL] = torch.where(readable_ids(shape[0]), 0.0, UNREADABLE_BIAS)
        return v
    v = torch.randn(shape, generator=gen) / shape[1] ** 0.5  # (out, in): unit-gain linear
    if name.endswith(("q_proj.weight", "k_proj.weight", "q_b_proj.weight")):
        return v * QK_GAIN
    if name.endswith("kv_b_proj.weight"):  # MLA: (H, nope + v, latent); only the key rows carry the gain
        m = cfg.mla
        v.view(cfg.n_heads, m.qk_nope_head_dim + m.v_head_dim, -1)[:, : m.qk_nope_head_dim] *= QK_GAIN
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        v[CONST_CHANNEL, :] = 0.0  # no layer writes the constant channel
    return v
