"""Ragged decode attention straight from a paged cache (kernels.paged_decode) against its
plain-torch reference and an fp64 oracle, and the model's decode path through it.

Tolerances (max abs error, unit-variance inputs): fp32 2e-5, bf16 3e-2 (as in
test_kernels_attention.py).
"""
from __future__ import annotations

import math
import random

import pytest
import torch

from kernels import paged_decode
from kernels.paged_decode import gather_blocks, reference
from shared.model.attention import StepIndex, _decode_attention
from shared.model.batch import ForwardBatch, SeqSlice

pytestmark = pytest.mark.model
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


def paged(n_blocks: int, bs: int, hkv: int, d: int, lens: list[int], dtype=torch.float32, seed: int = 0):
    """A cache with scattered, non-contiguous block tables; rows padded with block 0."""
    g = torch.Generator().manual_seed(seed)
    layer = torch.randn(n_blocks, 2, bs, hkv, d, generator=g, dtype=torch.float64).to(dtype)
    order = torch.randperm(n_blocks, generator=g).tolist()
    need = [-(-t // bs) for t in lens]
    tables = torch.zeros(len(lens), max(need), dtype=torch.long)
    at = 0
    for i, n in enumerate(need):
        tables[i, :n] = torch.tensor(order[at:at + n])
        at += n
    return layer, tables


def oracle(q, layer, tables, lens):
    """fp64, KV heads repeated explicitly, positions looked up one by one."""
    bs, h, hkv = layer.shape[2], q.shape[1], layer.shape[3]
    out = []
    for i, t in enumerate(lens):
        pos = torch.arange(t)
        k = layer[tables[i][pos // bs], 0, pos % bs].double().repeat_interleave(h // hkv, 1)  # (T, H, D)
        v = layer[tables[i][pos // bs], 1, pos % bs].double().repeat_interleave(h // hkv, 1)
        s = torch.einsum("hd,thd->ht", q[i].double(), k) / math.sqrt(q.shape[-1])
        out.append(torch.einsum("ht,thd->hd", s.softmax(-1), v))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("h,hkv", [(9, 3), (4, 4), (8, 1)])
def test_ragged_batch_matches_the_oracle(dtype, h, hkv):
    bs, d = 16, 32
    lens = [1, 15, 16, 17, 64, 93, 5]  # one token, block boundaries either side, several blocks
    layer, tables = paged(40, bs, hkv, d, lens, dtype)
    q = torch.randn(len(lens), h, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
    want = oracle(q, layer, tables, lens)
    got = paged_decode(q, layer, tables, lens)
    assert got.shape == (len(lens), h, d) and got.dtype == dtype
    assert (got.double() - want).abs().max().item() < TOL[dtype]
    assert (reference(q, layer, tables, lens).double() - want).abs().max().item() < TOL[dtype]


def test_positions_past_a_sequence_length_are_not_attended():
    """The tail of the last block (and any padding block) holds garbage that must not leak in."""
    bs, d, lens = 8, 16, [5, 11]
    layer, tables = paged(6, bs, 2, d, lens)
    q = torch.randn(2, 4, d)
    before = paged_decode(q, layer, tables, lens)
    for i, t in enumerate(lens):
        layer[tables[i, (t - 1) // bs], :, t % bs:] = 1e4  # rows after the last real position
    assert torch.equal(paged_decode(q, layer, tables, lens), before)


def test_model_decode_path_equals_the_reference():
    """The engine's decode attention (short contexts through paged_decode) on a real step index."""
    random.seed(3)
    bs, hkv, d, h = 16, 3, 32, 9
    lens = [random.randint(1, 200) for _ in range(12)]
    layer, tables = paged(160, bs, hkv, d, lens)
    seqs = [SeqSlice([7], t - 1, tables[i, :-(-t // bs)].tolist()) for i, t in enumerate(lens)]
    idx = StepIndex.build(ForwardBatch(seqs), bs)
    assert idx.decode is not None and idx.decode.lens == lens
    q = torch.randn(len(lens), h, d)
    got = _decode_attention(q, layer, idx.decode)
    assert (got.double() - oracle(q, layer, tables, lens)).abs().max().item() < 2e-5


@pytest.mark.parametrize("bad,match", [
    (dict(lens=[0, 3]), "context length 0"),
    (dict(lens=[3, 40]), "context length 40"),
    (dict(lens=[3]), "2 queries but 2 block tables and 1 lengths"),
    (dict(q=torch.randn(2, 5, 16)), "5 query heads are not a multiple of 2"),
    (dict(q=torch.randn(2, 16)), "want q"),
])
def test_bad_shapes_name_what_is_wrong(bad, match):
    layer, tables = paged(8, 8, 2, 16, [3, 9])
    args = dict(q=torch.randn(2, 4, 16), layer_kv=layer, tables=tables, lens=[3, 9]) | bad
    with pytest.raises(ValueError, match=match):
        paged_decode(**args)


def test_bench_baseline_agrees_with_the_kernel():
    """`python -m kernels.bench` compares against the padded-SDPA baseline: both must compute the same."""
    from kernels.bench import paged_timings

    (b, tokens, padded_ms, paged_ms, diff), = paged_timings([3], repeats=1)
    assert b == 3 and 900 <= tokens <= 6000 and padded_ms > 0 and paged_ms > 0
    assert diff < 1e-4


def test_gather_blocks_copies_the_slabs_of_one_layer_of_a_full_cache():
    """The right layer's slabs out of a (blocks, layers, 2, ...) cache, contiguous slab or not."""
    data = torch.randn(7, 4, 2, 8, 2, 16)  # (num_blocks, n_layers, kv, bs, Hkv, D)
    blocks = torch.tensor([5, 0, 3])
    for layer in range(4):
        for kv in (0, 1):
            want = data[:, layer, kv][blocks].reshape(-1, 2, 16)
            assert torch.equal(gather_blocks(data[:, layer], kv, blocks), want)
    odd = data.transpose(3, 4)[:, 1]  # a slab that is not contiguous
    assert torch.equal(gather_blocks(odd, 1, blocks), odd[:, 1][blocks].reshape(-1, 8, 16))
