"""An engine's store layout names its KV layout: GQA K/V planes or MLA latent rows (and the
latent's split), from the same container the engine's cache has; the fingerprint of a GQA
model is what it was before MLA existed, an MLA one differs from any GQA one of its dims."""
from __future__ import annotations

import msgspec
import pytest

from shared.engine.store_layout import engine_kv_layout, kv_layout, store_layout
from shared.kv.hashing import ModelFingerprint
from shared.kv.layout import KVKind, KVLayout
from shared.messages.storage_gateway import StoreLayout
from shared.model.config import ModelConfig
from shared.model.deepseek_shapes import IndexerShape, MLAShape, MoEShape

pytestmark = pytest.mark.unit
GQA = ModelConfig(name="g", n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32)
MLA = ModelConfig(name="m", arch="deepseek_v3", n_layers=3, n_heads=4, n_kv_heads=4, head_dim=32,
                  mla=MLAShape(q_lora_rank=48, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
                               v_head_dim=32), moe=MoEShape())
V32 = ModelConfig(name="s", arch="deepseek_v3", n_layers=3, n_heads=4, n_kv_heads=4, head_dim=32, mla=MLA.mla,
                  indexer=IndexerShape(n_heads=2, head_dim=16, topk=8, rope_dim=16))


def test_a_gqa_engine_keeps_its_heads_and_its_old_fingerprint():
    s = store_layout("g@1", GQA, 64)
    assert (s.kv_layout, s.n_kv_heads, s.head_dim, s.latent_rank) == (KVKind.GQA, 2, 32, 0)
    old = ModelFingerprint("g@1", "float32", 64, 4, 2, 32)  # the fields the fingerprint had before MLA
    assert s.fingerprint == old.digest()
    assert kv_layout(s) == engine_kv_layout(GQA, 64) == KVLayout(4, 2, 32, "float32", 64)


@pytest.mark.parametrize("cfg,split", [(MLA, (64, 16, 0)), (V32, (64, 16, 16))], ids=["v3", "v3.2"])
def test_an_mla_engine_names_its_latent_rows(cfg, split):
    s = store_layout("m@1", cfg, 64)
    width = sum(split)
    assert (s.kv_layout, s.n_kv_heads, s.head_dim) == (KVKind.MLA, 1, width // 2) == (KVKind.MLA,
                                                                                     *cfg.kv_cache_container)
    assert (s.latent_rank, s.rope_dim, s.index_dim) == split
    kv = kv_layout(s)
    assert kv == engine_kv_layout(cfg, 64) and kv.layer_bytes == 64 * cfg.kv_bytes_per_token_per_layer
    same_dims = ModelFingerprint("m@1", "float32", 64, 3, 1, width // 2)  # GQA planes of the same shape
    assert s.fingerprint != same_dims.digest()
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(s), type=StoreLayout) == s


def test_a_gqa_store_layout_on_the_wire_is_what_it_was():
    """The new fields have defaults and are omitted for GQA: old and new peers read each other."""
    s = store_layout("g@1", GQA, 64)
    assert set(msgspec.msgpack.decode(msgspec.msgpack.encode(s))) == {
        "fingerprint", "model_id", "n_layers", "n_kv_heads", "head_dim", "dtype", "block_size"}
