"""One KV-size formula: the bytes per token an engine's paged cache allocates for a config
equal what the planner (`dualpath plan`) and the simulator (`dualpath sim`) count for the
same config.json, for every shipped preset and for the tiny twins the engines run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dualpath.plan.attention import AttnInputs, plan_attention
from dualpath.presets import load_arch, load_config, preset_names
from dualpath.sim.hardware import load_hardware
from dualpath.sim.models import build_model
from shared.model.config import ModelConfig
from shared.model.kv_cache import PagedKVCache
from shared.model.loader import load_model
from shared.model.weights_deepseek import DEEPSEEK_TYPES, deepseek_config, deepseek_config_json
from shared.model.weights_hf import hf_config

pytestmark = pytest.mark.model
BLOCK = 4


def engine_config(c: dict, d: Path) -> ModelConfig:
    """The ModelConfig an engine would build from this config.json, KV in bf16."""
    if c.get("model_type") in DEEPSEEK_TYPES:
        return deepseek_config(c, name=d.name, dtype="bfloat16")
    (d / "config.json").write_text(json.dumps(c))
    return hf_config(str(d), eos_ids=(), dtype="bfloat16")


def engine_bytes_per_token(cfg: ModelConfig) -> int:
    """Bytes per token of a real allocated cache (one block), not of a formula."""
    kv = PagedKVCache.allocate(cfg, 1, BLOCK)
    assert kv.nbytes == kv.data.numel() * kv.data.element_size()
    return kv.nbytes // BLOCK


@pytest.mark.parametrize("name", preset_names())
def test_engine_cache_bytes_per_token_equal_the_planners_for_every_preset(tmp_path, name):
    _, c = load_config(name)
    cfg = engine_config(c, tmp_path)
    arch = load_arch(name)
    engine = engine_bytes_per_token(cfg)
    assert engine == cfg.kv_bytes_per_token
    # `dualpath plan` capacity: main KV + V3.2 indexer keys, at the KV dtype
    assert engine == arch.kv_bytes_per_token(2.0) + arch.index_bytes_per_token(2.0)
    plan = plan_attention(arch, AttnInputs(cards=8, batch=8, ctx=1024, kv_dtype="bf16"))
    assert engine - arch.index_bytes_per_token(2.0) == plan.kv_bytes_per_token  # attention layouts: main KV
    sim = build_model(name, load_hardware("h800"))  # the simulator: MLA KV and indexer keys fp8, GQA KV bf16
    main = engine - arch.index_bytes_per_token(2.0)
    assert sim.kv_main_bytes == main // 2 * (1 if arch.is_mla else 2)
    assert sim.kv_index_bytes == arch.index_bytes_per_token(1.0) == (cfg.indexer.head_dim * cfg.n_layers
                                                                      if cfg.indexer else 0)


@pytest.mark.parametrize("spec", ["tiny", "tiny-mla"])
def test_the_tiny_twins_engine_bytes_equal_the_planners_on_their_config_json(tmp_path, spec):
    m = load_model(spec, dtype="bfloat16")
    c = m.config
    if c.arch == "deepseek_v3":
        doc = deepseek_config_json(c)
    else:
        doc = dict(model_type="llama", vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                   intermediate_size=c.intermediate_size, num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
                   num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim)
    (tmp_path / "config.json").write_text(json.dumps(doc))
    arch = load_arch(str(tmp_path / "config.json"))
    assert engine_bytes_per_token(c) == arch.kv_bytes_per_token(2.0)
    assert arch.is_mla == (spec == "tiny-mla")


def test_mla_stores_the_latent_not_full_heads():
    """DS-V3: 61 layers x (512 + 64) values, not 61 x 2 x 128 heads x 128 dims; V3.2 adds a
    128-value indexer key per layer."""
    cfg = deepseek_config(load_config("ds-v3")[1], name="ds-v3", dtype="bfloat16")
    assert cfg.kv_bytes_per_token == 61 * 576 * 2
    assert torch.Size(PagedKVCache.shape_for(cfg, 1, 64)) == (1, 61, 2, 64, 1, 288)
    v32 = deepseek_config(load_config("ds-v3.2-660b")[1], name="ds-v3.2-660b", dtype="bfloat16")
    assert v32.kv_bytes_per_token == 61 * (576 + 128) * 2
