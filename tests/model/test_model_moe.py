"""DeepSeek-V3 MoE: `noaux_tc` routing and the expert sum against a plain-torch reference
that runs every expert on every token and routes token by token in Python."""
from __future__ import annotations

import pytest
import torch

from shared.model.deepseek_shapes import MoEShape
from shared.model.loader import load_model
from shared.model.moe import MoE, SwiGLU, route

pytestmark = pytest.mark.model
torch.set_num_threads(1)
SHAPE = MoEShape(n_routed_experts=16, n_shared_experts=2, experts_per_token=3, moe_intermediate_size=24,
                 n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True)


def reference_route(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, s: MoEShape) -> list[dict[int, float]]:
    """Per token {expert: weight}, by the V3 rule written out token by token."""
    out = []
    per_group = s.n_routed_experts // s.n_group
    for row in x:
        scores = [1 / (1 + torch.exp(-(weight[e] @ row))).item() for e in range(s.n_routed_experts)]
        choice = [scores[e] + bias[e].item() for e in range(s.n_routed_experts)]
        merit = [sum(sorted(choice[g * per_group : (g + 1) * per_group])[-2:]) for g in range(s.n_group)]
        groups = sorted(range(s.n_group), key=lambda g: -merit[g])[: s.topk_group]
        allowed = [e for e in range(s.n_routed_experts) if e // per_group in groups]
        picked = sorted(allowed, key=lambda e: -choice[e])[: s.experts_per_token]
        total = sum(scores[e] for e in picked) if s.norm_topk_prob else 1.0
        out.append({e: scores[e] / total * s.routed_scaling_factor for e in picked})
    return out


@pytest.fixture(scope="module")
def moe():
    torch.manual_seed(0)
    m = MoE(32, SHAPE).requires_grad_(False)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(torch.randn(p.shape) * (0.5 if "bias" in name else 1 / p.shape[-1] ** 0.5))
    return m


@pytest.fixture(scope="module")
def x():
    return torch.randn(64, 32, generator=torch.Generator().manual_seed(1))


def test_routing_picks_and_weights_match_the_reference(moe, x):
    ids, w = route(x, moe.gate.weight, moe.gate.e_score_correction_bias, SHAPE)
    want = reference_route(x, moe.gate.weight, moe.gate.e_score_correction_bias, SHAPE)
    for i, expect in enumerate(want):
        got = dict(zip(ids[i].tolist(), w[i].tolist()))
        assert got.keys() == expect.keys(), i
        assert all(abs(got[e] - expect[e]) <= 1e-6 * SHAPE.routed_scaling_factor for e in expect), i


def test_the_bias_and_the_group_limit_both_change_picks_here(moe, x):
    """The test above could not pass with either rule left out: each changes some token's experts."""
    g, b = moe.gate.weight, moe.gate.e_score_correction_bias
    ids = route(x, g, b, SHAPE)[0].sort(-1).values
    no_bias = route(x, g, torch.zeros_like(b), SHAPE)[0].sort(-1).values
    one_group = MoEShape(**{**SHAPE.__dict__, "n_group": 1, "topk_group": 1})
    no_groups = route(x, g, b, one_group)[0].sort(-1).values
    assert (ids != no_bias).any(dim=-1).sum() >= 5
    assert (ids != no_groups).any(dim=-1).sum() >= 5


def test_moe_output_equals_every_expert_weighted_by_the_reference_routing(moe, x):
    want = moe.shared_experts(x).clone()
    routes = reference_route(x, moe.gate.weight, moe.gate.e_score_correction_bias, SHAPE)
    every = torch.stack([expert(x) for expert in moe.experts], dim=1)  # (N, E, D): every expert, every token
    for i, picked in enumerate(routes):
        for e, w in picked.items():
            want[i] += w * every[i, e]
    with torch.inference_mode():
        got = moe(x)
    assert float((got - want).norm() / want.norm()) <= 1e-5


def test_shared_experts_are_one_mlp_of_n_shared_times_the_expert_width(moe):
    assert moe.shared_experts.gate_proj.weight.shape == (SHAPE.n_shared_experts * 24, 32)
    assert len(moe.experts) == 16


def test_tiny_mla_has_its_first_layer_dense_and_the_rest_moe():
    m = load_model("tiny-mla", seed=0)
    kinds = [type(block.mlp) for block in m.model.layers]
    assert kinds == [SwiGLU, MoE, MoE]
    assert m.model.layers[0].mlp.gate_proj.weight.shape == (m.config.intermediate_size, m.config.hidden_size)
