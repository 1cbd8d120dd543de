"""V3.2 sparse attention (lightning indexer + top-k) as an option of the DeepSeek model: the
indexer's choice matches a per-token reference, the paged path matches the cache-free pass,
and with top-k at least the context it is exactly dense MLA."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from shared.model.batch import ForwardBatch, SeqSlice
from shared.model.deepseek_rope import rope_tables
from shared.model.deepseek_shapes import IndexerShape
from shared.model.kv_cache import PagedKVCache
from shared.model.loader import LoadedModel, load_model, random_model
from tests.model.test_model_deepseek_checkpoint import write_checkpoint

pytestmark = pytest.mark.model
torch.set_num_threads(1)
REL = 1e-5


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def base():
    return load_model("tiny-mla", seed=0)


def sparse(base, topk: int, seed: int = 3) -> LoadedModel:
    cfg = dataclasses.replace(base.config, indexer=IndexerShape(n_heads=4, head_dim=24, topk=topk, rope_dim=16))
    return LoadedModel(random_model(cfg, seed), base.tokenizer, cfg, f"sparse@{topk}")


TEXT = "a context of some forty tokens, longer than the top-k of eight"


def test_the_indexer_picks_each_querys_top_k_like_a_per_token_reference(base):
    m = sparse(base, topk=8)
    attn = m.model.layers[1].self_attn
    ix = attn.indexer
    t = 30
    x = torch.randn(t, m.config.hidden_size, generator=torch.Generator().manual_seed(0))
    cos, sin = rope_tables(torch.arange(t), m.config, torch.float32)
    with torch.inference_mode():
        q, w = attn.index_queries(x, cos, sin)
        keys = ix.keys(x, cos, sin)
        got = ix.select(q, w, keys, torch.ones(t, t, dtype=torch.bool).tril())
    for i in range(t):
        score = [sum(float(w[i, h]) * max(0.0, float(q[i, h] @ keys[s])) for h in range(4)) for s in range(i + 1)]
        want = set(sorted(range(i + 1), key=lambda s: (-score[s], s))[:8])  # ties: the earlier token
        assert set(got[i].nonzero().flatten().tolist()) == want, i


def test_top_k_at_least_the_context_is_dense_mla(base):
    m = sparse(base, topk=1024)
    dense_cfg = dataclasses.replace(m.config, indexer=None)
    dense = random_model(dense_cfg, seed=0)
    dense.load_state_dict({k: v for k, v in m.model.state_dict().items() if ".indexer." not in k}, strict=True)
    ids = base.tokenizer.encode(TEXT)
    assert torch.equal(m.model.forward_reference(ids), dense.forward_reference(ids))
    narrow = sparse(base, topk=8)
    narrow.model.load_state_dict(m.model.state_dict())
    # top-8 of ~60 tokens is not dense
    assert rel(narrow.model.forward_reference(ids)[-1], dense.forward_reference(ids)[-1]) > 1e-3


def test_paged_sparse_prefill_chunks_and_decode_match_the_reference(base):
    m = sparse(base, topk=8)
    ids = base.tokenizer.encode(TEXT)
    kv = PagedKVCache.allocate(m.config, 10, 8)
    table = [9, 2, 5, 0, 7, 1, 3, 8]
    assert len(ids) <= 8 * len(table)
    got = {}
    got[19] = m.model.forward(ForwardBatch([SeqSlice(ids[:20], 0, table)]), kv)[0]
    got[len(ids) - 4] = m.model.forward(ForwardBatch([SeqSlice(ids[20:-3], 20, table)]), kv)[0]
    for pos in range(len(ids) - 3, len(ids)):
        got[pos] = m.model.forward(ForwardBatch([SeqSlice([ids[pos]], pos, table)]), kv)[0]
    ref = m.model.forward_reference(ids)
    for pos, logits in got.items():
        assert rel(logits, ref[pos]) <= REL, pos


def test_the_cache_row_carries_the_indexer_key_after_the_latent(base):
    m = sparse(base, topk=8)
    w = m.config.mla.kv_lora_rank + m.config.mla.qk_rope_head_dim + 24
    assert m.config.kv_cache_container == (1, w // 2)
    assert m.config.kv_bytes_per_token == m.config.n_layers * w * 4


def test_a_v32_checkpoint_loads_with_its_indexer(tmp_path, base):
    src = sparse(base, topk=8, seed=5)
    want = write_checkpoint(src, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "deepseek_v32"
    hf = load_model(str(tmp_path))
    assert hf.config.indexer == src.config.indexer
    assert any(".indexer." in k for k in want)
    same = random_model(src.config, seed=0)
    same.load_state_dict(want, strict=True)
    ids = base.tokenizer.encode(TEXT)
    torch.testing.assert_close(hf.model.forward_reference(ids), same.forward_reference(ids), rtol=0, atol=1e-5)
