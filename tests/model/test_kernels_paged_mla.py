"""Absorbed MLA decode straight from the paged latent cache (kernels.paged_mla) against its
plain-torch reference and an fp64 oracle that builds each row from the cache position by position.

Tolerances (max abs error, unit-variance inputs): fp32 2e-5, bf16 3e-2 (as test_kernels_paged_decode.py).
"""
from __future__ import annotations

import pytest
import torch

from kernels.paged_mla import gather_rows, paged_mla_decode, reference

pytestmark = pytest.mark.model
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
C, ROPE, INDEX = 24, 8, 8  # latent, rope key, V3.2 index key: rows of 40 values, planes of 20


def paged(n_blocks: int, bs: int, lens: list[int], width: int, dtype=torch.float32, seed: int = 0):
    """A latent cache with scattered block tables (rows padded with block 0)."""
    g = torch.Generator().manual_seed(seed)
    layer = torch.randn(n_blocks, 2, bs, 1, width // 2, generator=g, dtype=torch.float64).to(dtype)
    order = torch.randperm(n_blocks, generator=g).tolist()
    need = [-(-t // bs) for t in lens]
    tables = torch.zeros(len(lens), max(need), dtype=torch.long)
    at = 0
    for i, n in enumerate(need):
        tables[i, :n] = torch.tensor(order[at:at + n])
        at += n
    return layer, tables


def oracle(q, layer, tables, lens, scale, masks=None):
    """fp64: row p of sequence i is plane 0 then plane 1 at (block p // bs, slot p % bs)."""
    bs, out = layer.shape[2], []
    for i, t in enumerate(lens):
        rows = torch.stack([torch.cat([layer[tables[i][p // bs], 0, p % bs, 0], layer[tables[i][p // bs], 1, p % bs, 0]])
                            for p in range(t)]).double()  # (T, W)
        s = q[i].double() @ rows[:, :C + ROPE].T * scale  # (H, T)
        if masks is not None:
            s = s.masked_fill(~masks[i], float("-inf"))
        out.append(s.softmax(-1) @ rows[:, :C])
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [C + ROPE, C + ROPE + INDEX], ids=["v3", "v3.2-row"])
def test_ragged_batch_matches_the_oracle(dtype, width):
    bs, h = 16, 6
    lens = [1, 15, 16, 17, 64, 93, 5]  # one token, block boundaries either side, several blocks
    layer, tables = paged(40, bs, lens, width, dtype)
    q = torch.randn(len(lens), h, C + ROPE, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
    scale = (C + ROPE) ** -0.5
    want = oracle(q, layer, tables, lens, scale)
    got = paged_mla_decode(q, layer, tables, lens, values=C, scale=scale)
    assert got.shape == (len(lens), h, C) and got.dtype == dtype
    assert (got.double() - want).abs().max().item() < TOL[dtype]
    assert (reference(q, layer, tables, lens, values=C, scale=scale).double() - want).abs().max().item() < TOL[dtype]


def test_positions_past_a_sequence_length_are_not_attended():
    bs, lens = 8, [5, 11]
    layer, tables = paged(6, bs, lens, C + ROPE)
    q = torch.randn(2, 4, C + ROPE)
    before = paged_mla_decode(q, layer, tables, lens, values=C, scale=0.2)
    for i, t in enumerate(lens):
        layer[tables[i, (t - 1) // bs], :, t % bs:] = 1e4  # rows after the last real position
    assert torch.equal(paged_mla_decode(q, layer, tables, lens, values=C, scale=0.2), before)


def test_a_mask_keeps_only_the_chosen_tokens():
    """V3.2: a query attends to its top-k tokens only; an unchosen token's row does not matter."""
    bs, lens = 8, [20, 9]
    layer, tables = paged(8, bs, lens, C + ROPE + INDEX)
    q = torch.randn(2, 3, C + ROPE, dtype=torch.float64).float()
    masks = [torch.arange(20) % 3 == 0, torch.ones(9, dtype=torch.bool)]
    got = paged_mla_decode(q, layer, tables, lens, values=C, scale=0.3, masks=masks)
    assert (got.double() - oracle(q, layer, tables, lens, 0.3, masks)).abs().max().item() < TOL[torch.float32]
    layer[tables[0, 0], :, 1] = 1e4  # token 1 of sequence 0 is not chosen
    assert torch.equal(paged_mla_decode(q, layer, tables, lens, values=C, scale=0.3, masks=masks)[0], got[0])
    assert not torch.equal(paged_mla_decode(q, layer, tables, lens, values=C, scale=0.3)[0], got[0])


def test_gather_rows_joins_the_two_planes_of_each_token():
    layer, _ = paged(3, 4, [4], C + ROPE)
    rows = gather_rows(layer, torch.tensor([2, 0]))
    assert rows.shape == (8, C + ROPE)
    assert torch.equal(rows[5], torch.cat([layer[0, 0, 1, 0], layer[0, 1, 1, 0]]))


@pytest.mark.parametrize("bad", ["heads", "width", "lens", "mask"])
def test_bad_shapes_are_a_value_error(bad):
    layer, tables = paged(4, 8, [9], C + ROPE)
    q, lens, masks = torch.randn(1, 2, C + ROPE), [9], None
    if bad == "heads":
        layer = layer.expand(-1, -1, -1, 2, -1)
    elif bad == "width":
        q = torch.randn(1, 2, C + ROPE + 2)
    elif bad == "lens":
        lens = [17]
    else:
        masks = [torch.ones(8, dtype=torch.bool)]
    with pytest.raises(ValueError):
        paged_mla_decode(q, layer, tables, lens, values=C, scale=1.0, masks=masks)
