"""DCP sharding, ring and Ulysses attention and causal partitions vs unsharded attention.

Tolerances: fp32 2e-5, bf16 3e-2 (max abs, unit-variance inputs, vs fp64 reference).
"""
from __future__ import annotations

import pytest
import torch

from kernels import attention as attn
from kernels import dcp, partition, ring, ulysses

pytestmark = pytest.mark.model
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,n", [(50, 4), (3, 5), (64, 1), (17, 3)])
def test_dcp_merged_equals_unsharded(dtype, t, n):
    q, k, v = rand(2, 8, 16, dtype=dtype), rand(t, 4, 16, dtype=dtype, seed=1), rand(t, 4, 16, dtype=dtype, seed=2)
    ks, vs = dcp.shard(k, n), dcp.shard(v, n)
    assert sum(x.shape[0] for x in ks) == t
    out, _ = dcp.dcp_attention(q[:1] if t < 2 else q, ks, vs)
    ref = dcp.reference(*(x.double() for x in ((q[:1] if t < 2 else q), k, v)))
    assert (out.double() - ref).abs().max() < TOL[dtype]


def test_dcp_home_places_position_p_on_shard_p_mod_n():
    k = torch.arange(10).view(10, 1, 1).float()
    shards = dcp.shard(k, 4)
    for p in range(10):
        r, slot = dcp.home(p, 4)
        assert shards[r][slot].item() == p
    assert [len(x) for x in dcp.shard_positions(3, 5)] == [1, 1, 1, 0, 0]


@pytest.mark.parametrize("scheme", partition.SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ring_attention_equals_full_causal(scheme, dtype):
    t, n = 48, 4
    q, k, v = rand(1, 4, t, 16, dtype=dtype), rand(1, 2, t, 16, dtype=dtype, seed=1), rand(1, 2, t, 16, dtype=dtype, seed=2)
    pos = partition.positions(t, n, scheme)
    outs, _, work = ring.ring_attention(*(partition.split(x, pos, 2) for x in (q, k, v)), pos)
    ref = attn.reference(q.double(), k.double(), v.double(), causal=True)[0]
    assert (partition.unsplit(outs, pos, 2).double() - ref).abs().max() < TOL[dtype]
    assert work == partition.causal_work(t, n, scheme)


def test_ring_with_empty_shards():
    t, n = 3, 5
    q, k, v = rand(1, 2, t, 8), rand(1, 2, t, 8, seed=1), rand(1, 2, t, 8, seed=2)
    pos = partition.positions(t, n, "contiguous")
    assert min(p.numel() for p in pos) == 0
    outs, _, _ = ring.ring_attention(*(partition.split(x, pos, 2) for x in (q, k, v)), pos)
    ref = attn.reference(q, k, v, causal=True)[0]
    assert torch.allclose(partition.unsplit(outs, pos, 2), ref, atol=2e-5)


def test_balance_zigzag_and_interleave_fix_contiguous():
    work = {s: partition.causal_work(4096, 8, s) for s in partition.SCHEMES}
    assert partition.imbalance(work["contiguous"]) > 1.8
    assert partition.imbalance(work["zigzag"]) < 1.001
    assert partition.imbalance(work["interleave"]) < 1.01
    assert all(sum(w) == 4096 * 4097 // 2 for w in work.values())


@pytest.mark.parametrize("hkv", [4, 2])
def test_ulysses_layout_switch_round_trips_and_matches(hkv):
    t, n = 40, 4
    q, k, v = rand(2, 8, t, 16), rand(2, hkv, t, 16, seed=1), rand(2, hkv, t, 16, seed=2)
    pos = partition.positions(t, n, "zigzag")
    qs = partition.split(q, pos, 2)
    heads = ulysses.seq_to_head(qs)
    assert heads[0].shape == (2, 2, t, 16)
    back = ulysses.head_to_seq(heads, [p.numel() for p in pos])
    assert all(torch.equal(a, b) for a, b in zip(back, qs))
    outs = ulysses.ulysses_attention(qs, partition.split(k, pos, 2), partition.split(v, pos, 2), pos)
    assert torch.allclose(partition.unsplit(outs, pos, 2), ulysses.reference(q, k, v), atol=2e-5)


def test_ulysses_rejects_heads_not_divisible():
    with pytest.raises(ValueError, match="heads"):
        ulysses.seq_to_head([torch.zeros(1, 6, 2, 4)] * 4)
