"""Presets: shipped configs parse, and shape-derived counts match published sizes."""
from __future__ import annotations

import json

import pytest

from dualpath.presets import ArchConfigError, load_arch, load_config, preset_names
from dualpath.presets.counts import attended_pairs

pytestmark = pytest.mark.unit

# Published parameter counts (billions) and the tolerance the shapes must hit.
PUBLISHED = {
    "ds-v3": (671.0, 37.0),  # 671B total, 37B activated (MTP layer excluded)
    "llama-3-70b": (70.55, 70.55),
    "qwen2.5-32b": (32.76, 32.76),
    "smollm2-135m": (0.1345, 0.1345),
}


def test_all_required_presets_are_shipped():
    assert {"ds-v3", "ds-v3.2-660b", "ds-27b", "qwen2.5-32b", "llama-3-70b",
            "smollm2-135m"} <= set(preset_names())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_counts_match_published_sizes(name):
    total, active = PUBLISHED[name]
    p = load_arch(name).params()
    assert p.total / 1e9 == pytest.approx(total, rel=0.01)
    assert p.active_per_token / 1e9 == pytest.approx(active, rel=0.03)


def test_ds27b_matches_paper_section_8():
    a = load_arch("ds-27b")
    assert (a.hidden, a.intermediate, a.num_layers, a.num_heads) == (2560, 12288, 30, 32)
    assert (a.n_routed_experts, a.moe_intermediate, a.experts_per_token) == (72, 1536, 6)
    assert (a.n_shared_experts, a.first_dense_layers, a.q_lora_rank) == (2, 1, 0)
    assert (a.index_n_heads, a.index_head_dim, a.index_topk) == (32, 64, 1024)
    assert a.params().total / 1e9 == pytest.approx(27.0, rel=0.03)


def test_v32_is_v3_plus_indexer():
    v3, v32 = load_arch("ds-v3"), load_arch("ds-v3.2-660b")
    assert v32.is_sparse and not v3.is_sparse
    assert v32.params().routed_experts == v3.params().routed_experts
    assert v32.params().attention > v3.params().attention
    assert v32.kv_bytes_per_token(1) == v3.kv_bytes_per_token(1)
    assert v32.index_bytes_per_token(1) == 61 * 128


def test_kv_bytes_mla_caches_latent_plus_rope():
    a = load_arch("ds-v3")
    assert a.kv_bytes_per_token(1) == 61 * (512 + 64)
    assert a.kv_bytes_per_token(2) == 2 * 61 * 576


def test_kv_bytes_gqa_caches_k_and_v_per_kv_head():
    assert load_arch("qwen2.5-32b").kv_bytes_per_token(2) == 64 * 2 * 8 * 128 * 2
    assert load_arch("llama-3-70b").kv_bytes_per_token(2) == 80 * 2 * 8 * 128 * 2


def test_qwen2_counts_qkv_bias_and_smollm_ties_embeddings():
    q = load_arch("qwen2.5-32b")
    assert q.attention_bias
    no_bias = q.replace(attention_bias=False)
    assert q.attention_params_per_layer() - no_bias.attention_params_per_layer() == (40 + 16) * 128
    s = load_arch("smollm2-135m")
    assert s.params().embeddings == 49152 * 576


def test_prefill_flops_is_twice_active_non_embedding():
    a = load_arch("llama-3-70b")
    p = a.params()
    assert a.prefill_flops_per_token() == 2 * (p.active_per_token - p.embeddings - p.norms)


def test_attention_flops_causal_and_cached():
    a = load_arch("llama-3-70b")
    per_pair = 80 * 64 * 2 * (128 + 128)
    assert a.attention_flops(0, 4) == 10 * per_pair  # 1+2+3+4 causal pairs
    assert a.attention_flops(100, 2) == (101 + 102) * per_pair
    assert a.attention_flops(5, 0) == 0


def test_sparse_attention_caps_keys_at_topk():
    assert attended_pairs(0, 10, topk=4) == 1 + 2 + 3 + 4 * 7
    assert attended_pairs(10, 3, topk=4) == 12
    assert attended_pairs(0, 3, topk=100) == attended_pairs(0, 3)
    with pytest.raises(ValueError, match="-1"):
        attended_pairs(-1, 3)


def test_load_arch_from_path_and_errors(tmp_path):
    _, cfg = load_config("qwen2.5-32b")
    path = tmp_path / "mymodel" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    a = load_arch(str(path))
    assert a.name == "mymodel" and a == load_arch("qwen2.5-32b").replace(name="mymodel")
    assert load_arch(str(path.parent)).hidden == 5120
    del cfg["hidden_size"]
    path.write_text(json.dumps(cfg))
    with pytest.raises(ArchConfigError, match="hidden_size"):
        load_arch(str(path))
    with pytest.raises(ArchConfigError, match="no-such-model"):
        load_arch("no-such-model")


def test_arch_is_frozen():
    a = load_arch("ds-v3")
    with pytest.raises(AttributeError):
        a.hidden = 1  # type: ignore[misc]
