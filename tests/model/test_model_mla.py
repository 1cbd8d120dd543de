"""MLA: the absorbed (decode) and up-projected (prefill) forms equal the naive oracle that
materialises full K/V, and the paged cache holds one latent row per token per layer."""
from __future__ import annotations

import pytest
import torch

from shared.model.batch import ForwardBatch, SeqSlice
from shared.model.deepseek_rope import rope_tables
from shared.model.kv_cache import PagedKVCache
from shared.model.loader import load_model
from shared.model.mla import attend_absorbed, attend_expanded, naive_attention, read_rows

pytestmark = pytest.mark.model
torch.set_num_threads(1)
REL = 1e-5  # fp32, relative (Frobenius norm of the difference over the norm of the oracle)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def mla():
    return load_model("tiny-mla", seed=0)


def _inputs(mla, t: int, layer: int = 1, seed: int = 0):
    attn = mla.model.layers[layer].self_attn
    x = torch.randn(t, mla.config.hidden_size, generator=torch.Generator().manual_seed(seed))
    cos, sin = rope_tables(torch.arange(t), mla.config, torch.float32)
    q_nope, q_pe = attn.queries(x, cos, sin)
    return attn, q_nope, q_pe, attn.latent(x, cos, sin)


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_absorbed_and_expanded_attention_equal_the_naive_oracle(mla, layer):
    attn, q_nope, q_pe, rows = _inputs(mla, 40, layer)
    with torch.inference_mode():
        want = naive_attention(attn, q_nope, q_pe, rows)
        causal = torch.ones(40, 40, dtype=torch.bool).tril()
        absorbed = attend_absorbed(attn, q_nope, q_pe, rows, causal)
        expanded = attend_expanded(attn, q_nope, q_pe, rows, None)
    assert rel(absorbed, want) <= REL
    assert rel(expanded, want) <= REL
    assert want.shape == (40, mla.config.n_heads, mla.config.mla.v_head_dim)


def test_absorbed_decode_of_the_last_token_equals_the_oracles_last_row(mla):
    attn, q_nope, q_pe, rows = _inputs(mla, 33, seed=5)
    with torch.inference_mode():
        want = naive_attention(attn, q_nope, q_pe, rows)[-1]
        got = attend_absorbed(attn, q_nope[-1:], q_pe[-1:], rows)[0]
    assert rel(got, want) <= REL


def test_the_cache_stores_one_latent_row_per_token_per_layer(mla):
    cfg = mla.config
    width = cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim
    kv = PagedKVCache.allocate(cfg, 3, 16)
    assert kv.block_nbytes == 16 * cfg.n_layers * width * 4 == 16 * cfg.kv_bytes_per_token
    ids = mla.tokenizer.encode("the latent row of every token")[:20]
    mla.model.forward(ForwardBatch([SeqSlice(ids, 0, [2, 0])]), kv)
    attn, layer = mla.model.layers[1].self_attn, 1
    x = mla.model.embed_tokens(torch.tensor(ids))
    blk = mla.model.layers[0]  # recompute layer 1's input with the reference pass's pieces
    cos, sin = rope_tables(torch.arange(len(ids)), cfg, torch.float32)
    with torch.inference_mode():
        h = blk.input_layernorm(x)
        q_nope, q_pe = blk.self_attn.queries(h, cos, sin)
        x = x + blk.self_attn.out(naive_attention(blk.self_attn, q_nope, q_pe, blk.self_attn.latent(h, cos, sin)))
        x = x + blk.mlp(blk.post_attention_layernorm(x))
        want = attn.latent(mla.model.layers[layer].input_layernorm(x), cos, sin)  # (20, W)
    got = read_rows(kv.layer_view(layer), torch.tensor([2, 0]))[:20]
    assert rel(got, want) <= REL
    half = want.shape[1] // 2  # plane 0 holds each row's first half, plane 1 the rest
    assert torch.equal(kv.data[2, layer, 0, 3, 0], got[3, :half])
    assert torch.equal(kv.data[2, layer, 1, 3, 0], got[3, half:])
    assert torch.count_nonzero(kv.data[1]) == 0  # block 1 is not in the table: untouched


def test_paged_prefill_chunked_prefill_and_decode_match_the_reference_logits(mla):
    a = mla.tokenizer.encode("Once upon a time a small robot walked to the harbour and counted ships")
    b = mla.tokenizer.encode("def add(a, b): return a + b  # five")
    kv = PagedKVCache.allocate(mla.config, 16, 8)
    ta, tb = [7, 1, 9, 4, 11, 2, 10, 3, 5, 13], [6, 8, 0, 15, 12]
    assert len(a) <= 8 * len(ta) and len(b) <= 8 * len(tb)
    m = mla.model
    got_a, got_b = {}, {}
    # one step with a whole prefill of b and a first chunk of a, then a's second chunk, then decode both
    out = m.forward(ForwardBatch([SeqSlice(a[:30], 0, ta), SeqSlice(b[:-3], 0, tb)]), kv)
    got_a[29], got_b[len(b) - 4] = out[0], out[1]
    out = m.forward(ForwardBatch([SeqSlice(a[30:-4], 30, ta)]), kv)
    got_a[len(a) - 5] = out[0]
    for j in range(3):
        pa, pb = len(a) - 4 + j, len(b) - 3 + j
        out = m.forward(ForwardBatch([SeqSlice([a[pa]], pa, ta), SeqSlice([b[pb]], pb, tb)]), kv)
        got_a[pa], got_b[pb] = out[0], out[1]
    ref_a, ref_b = m.forward_reference(a), m.forward_reference(b)
    for pos, logits in got_a.items():
        assert rel(logits, ref_a[pos]) <= REL, pos
    for pos, logits in got_b.items():
        assert rel(logits, ref_b[pos]) <= REL, pos


def test_yarn_keeps_fast_dims_stretches_slow_ones_and_scales_the_softmax():
    import math

    from dualpath.presets import load_config
    from shared.model.deepseek_rope import _yarn_inv_freq
    from shared.model.mla import softmax_scale
    from shared.model.weights_deepseek import deepseek_config

    cfg = deepseek_config(load_config("ds-v3")[1], name="ds-v3")
    inv = _yarn_inv_freq(64, 10000.0, cfg.yarn)
    plain = 1.0 / 10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    assert torch.equal(inv[:10], plain[:10])  # high-frequency dims: extrapolated as trained
    torch.testing.assert_close(inv[-8:], plain[-8:] / 40.0, rtol=1e-12, atol=0)  # low-frequency: interpolated
    assert ((inv[10:-8] <= plain[10:-8]) & (inv[10:-8] >= plain[10:-8] / 40.0)).all()
    assert softmax_scale(cfg) == pytest.approx(192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2, rel=1e-12)


def test_a_yarn_scaled_model_decodes_through_the_cache_like_its_reference(mla):
    import dataclasses

    from shared.model.deepseek_shapes import YarnScaling
    from shared.model.loader import random_model

    cfg = dataclasses.replace(mla.config, yarn=YarnScaling(factor=4.0, original_max_position=16, mscale_all_dim=1.0))
    model = random_model(cfg, seed=2)
    ids = mla.tokenizer.encode("a context longer than the trained sixteen positions")
    kv = PagedKVCache.allocate(cfg, 8, 8)
    table = list(range(8))
    model.forward(ForwardBatch([SeqSlice(ids[:-1], 0, table)]), kv)
    last = model.forward(ForwardBatch([SeqSlice(ids[-1:], len(ids) - 1, table)]), kv)[0]
    ref = model.forward_reference(ids)
    assert rel(last, ref[-1]) <= REL
    plain = random_model(dataclasses.replace(cfg, yarn=None), seed=2).forward_reference(ids)
    assert rel(ref[-1], plain[-1]) > 0.01  # same weights: the scaling is not a no-op
