"""Attention with LSE, the LSE merge and split-KV decode against an fp64 oracle.

Tolerances (max abs error on unit-variance inputs): fp32 2e-5; bf16 3e-2 (bf16 has
8 mantissa bits; outputs are rounded once to bf16). The oracle is a naive
softmax(q k^T) v in float64 with explicitly repeated KV heads.
"""
from __future__ import annotations

import math

import pytest
import torch

from kernels import attention as attn
from kernels import decode, lse_merge

pytestmark = pytest.mark.model
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


def oracle(q, k, v, causal):
    """(B, H, Tq, D) naive fp64 attention; causal bottom-right aligned."""
    h, hkv = q.shape[1], k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(h // hkv, 1), v.double().repeat_interleave(h // hkv, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    tq, tk = s.shape[-2:]
    if causal:
        s = s.masked_fill(torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq).logical_not(), -math.inf)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 4, 1, 7, 16, 4), (2, 8, 5, 33, 32, 2), (1, 6, 17, 17, 8, 6)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_oracle_with_gqa(dtype, shape, causal):
    b, h, tq, tk, d, hkv = shape
    q, k, v = rand(b, h, tq, d, dtype=dtype), rand(b, hkv, tk, d, dtype=dtype, seed=1), rand(b, hkv, tk, d, dtype=dtype, seed=2)
    out, lse = attn.attention(q, k, v, causal=causal)
    ref_out, ref_lse = oracle(q, k, v, causal)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert (out.double() - ref_out).abs().max() < TOL[dtype]
    assert (lse.double() - ref_lse).abs().max() < 1e-4


def test_rows_without_visible_keys_are_zero_with_lse_minus_inf():
    q, k, v = rand(1, 2, 3, 8), rand(1, 2, 4, 8, seed=1), rand(1, 2, 4, 8, seed=2)
    out, lse = attn.attention(q, k, v, causal=True, q_pos=torch.tensor([0, 5, 9]),
                              k_pos=torch.tensor([3, 4, 6, 7]))
    assert torch.isneginf(lse[..., 0]).all() and (out[..., 0, :] == 0).all()
    assert torch.isfinite(lse[..., 1:]).all()
    empty_out, empty_lse = attn.attention(q, k[:, :, :0], v[:, :, :0])
    assert (empty_out == 0).all() and torch.isneginf(empty_lse).all()


def test_gqa_head_count_mismatch_is_rejected():
    with pytest.raises(ValueError, match="not a multiple"):
        attn.attention(rand(1, 6, 1, 8), rand(1, 4, 3, 8), rand(1, 4, 3, 8))


@pytest.mark.parametrize("n", [1, 2, 5])
def test_lse_merge_of_key_shards_equals_full_attention(n):
    q, k, v = rand(2, 4, 3, 16), rand(2, 4, 40, 16, seed=1), rand(2, 4, 40, 16, seed=2)
    cuts = torch.linspace(0, 40, n + 1).long().tolist()
    parts = [attn.attention(q, k[:, :, a:b], v[:, :, a:b]) for a, b in zip(cuts, cuts[1:])]
    out, lse = lse_merge.merge([p[0] for p in parts], [p[1] for p in parts])
    ref_out, ref_lse = oracle(q, k, v, causal=False)
    assert (out.double() - ref_out).abs().max() < 2e-5
    assert (lse.double() - ref_lse).abs().max() < 1e-4


def test_lse_merge_ignores_empty_shards_and_all_empty_gives_zero():
    o, lse = torch.randn(3, 5), torch.randn(3)
    empty_o, empty_l = torch.full((3, 5), 7.0), torch.full((3,), -math.inf)
    out, merged = lse_merge.merge([o, empty_o, empty_o], [lse, empty_l, empty_l])
    assert torch.equal(merged, lse) and torch.allclose(out, o)
    out, merged = lse_merge.merge([empty_o, empty_o], [empty_l, empty_l])
    assert (out == 0).all() and torch.isneginf(merged).all() and not out.isnan().any()
    with pytest.raises(ValueError):
        lse_merge.merge([], [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,split", [(1, 4), (100, 7), (128, 32), (300, 512)])
@pytest.mark.parametrize("tq", [1, 3])
def test_split_kv_decode_equals_single_pass(dtype, t, split, tq):
    tq = min(tq, t)  # the new tokens are part of the sequence
    q, k, v = rand(tq, 8, 32, dtype=dtype), rand(t, 2, 32, dtype=dtype, seed=1), rand(t, 2, 24, dtype=dtype, seed=2)
    out, lse = decode.split_kv(q, k, v, split_size=split)
    ref = oracle(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], True)[0]
    assert out.shape == (tq, 8, 24) and out.dtype == dtype
    assert (out.double() - ref[0].transpose(0, 1)).abs().max() < TOL[dtype]
    single = decode.reference(q, k, v)
    assert (out.float() - single.float()).abs().max() < TOL[dtype]


def test_engine_entry_point_shapes_and_batch():
    q, k, v = rand(8, 64), rand(5000, 2, 64, seed=1), rand(5000, 2, 64, seed=2)
    out = decode.decode_attention(q, k, v, split_size=1024)
    assert out.shape == (8, 64)
    assert (out - decode.reference(q[None], k, v)[0]).abs().max() < 2e-5
    ks, vs = [k[:10], k[:3000]], [v[:10], v[:3000]]
    batch = decode.decode_attention_batch(torch.stack([q, q]), ks, vs, split_size=1024)
    assert torch.allclose(batch[1], decode.reference(q[None], ks[1], vs[1])[0], atol=2e-5)
    with pytest.raises(ValueError, match="Tq"):
        decode.decode_attention(rand(4, 8, 64), k[:2], v[:2])
