"""DeepSeek-V3 checkpoints: config.json + HF-layout safetensors with FP8 block-scaled weights
(dequantized on load) and BF16 ones, and the tokenizer from tokenizer.json."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dualpath.presets import load_config
from shared.model.loader import LoadedModel, load_model, random_model
from shared.model.reference import generate
from shared.model.weights_deepseek import deepseek_config, deepseek_config_json, dequantize_fp8
from shared.model.weights_hf import UnsupportedCheckpoint

pytestmark = pytest.mark.model
torch.set_num_threads(1)
BLOCK = (32, 32)  # weight_block_size of the test checkpoint: q_b_proj (192, 48) -> 6 x 2 blocks, the last ones partial
FP8_NAME = "model.layers.1.self_attn.q_b_proj.weight"
BF16_NAME = "model.layers.2.mlp.experts.3.up_proj.weight"


def quantize_fp8(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block amax / 448 scales (DeepSeek's recipe), as the checkpoint stores them."""
    rows, cols = -(-w.shape[0] // block[0]), -(-w.shape[1] // block[1])
    scale = torch.empty(rows, cols)
    for i in range(rows):
        for j in range(cols):
            tile = w[i * block[0] : (i + 1) * block[0], j * block[1] : (j + 1) * block[1]]
            scale[i, j] = tile.abs().max() / 448.0
    full = scale.repeat_interleave(block[0], 0)[: w.shape[0]].repeat_interleave(block[1], 1)[:, : w.shape[1]]
    return (w / full).to(torch.float8_e4m3fn), scale


def write_checkpoint(src: LoadedModel, d: Path) -> dict[str, torch.Tensor]:
    """src's weights in the HF DeepSeek-V3 layout; returns the weights a correct loader must produce."""
    sd = {f"model.{k}": v.contiguous() for k, v in src.model.state_dict().items() if not k.startswith("lm_head")}
    sd["lm_head.weight"] = src.model.lm_head.weight.contiguous()
    fp8, scale = quantize_fp8(sd[FP8_NAME], BLOCK)
    sd[FP8_NAME], sd[FP8_NAME + "_scale_inv"] = fp8, scale
    sd[BF16_NAME] = sd[BF16_NAME].to(torch.bfloat16)
    sd["model.layers.3.self_attn.kv_b_proj.weight"] = torch.zeros(4, 4)  # an MTP layer: not part of the model
    save_file(sd, str(d / "model.safetensors"))
    config = {**deepseek_config_json(src.config), "eos_token_id": [258], "bos_token_id": 256,
              "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": list(BLOCK)}}
    (d / "config.json").write_text(json.dumps(config))
    src.tokenizer.inner.save(str(d / "tokenizer.json"))
    want = {k.removeprefix("model."): v for k, v in sd.items() if "_scale_inv" not in k and "layers.3." not in k}
    want[FP8_NAME.removeprefix("model.")] = dequantize_fp8(fp8, scale, BLOCK)
    want[BF16_NAME.removeprefix("model.")] = sd[BF16_NAME].float()
    return want


@pytest.fixture(scope="module")
def src():
    return load_model("tiny-mla", seed=4)


def test_a_deepseek_directory_loads_fp8_dequantized_and_bf16_kept(tmp_path, src):
    want = write_checkpoint(src, tmp_path)
    hf = load_model(str(tmp_path))
    assert hf.config == deepseek_config(json.loads((tmp_path / "config.json").read_text()), name=tmp_path.name,
                                        eos_ids=(258,))
    got = hf.model.state_dict()
    assert got.keys() == want.keys()
    for name, w in want.items():
        assert torch.equal(got[name], w), name
    q_b = got[FP8_NAME.removeprefix("model.")]
    assert not torch.equal(q_b, src.model.state_dict()[FP8_NAME.removeprefix("model.")])  # FP8 rounding happened
    assert float((q_b - src.model.state_dict()[FP8_NAME.removeprefix("model.")]).norm() / q_b.norm()) < 0.05


def test_the_loaded_checkpoint_generates_with_its_tokenizer(tmp_path, src):
    want = write_checkpoint(src, tmp_path)
    hf = load_model(str(tmp_path))
    ids = hf.tokenizer.encode("héllo, latent world")
    assert ids == src.tokenizer.encode("héllo, latent world")
    assert hf.config.eos_ids == (258,) and hf.config.bos_id == 256
    same = random_model(src.config, seed=4)  # the source model with the dequantized / bf16-rounded weights
    same.load_state_dict(want, strict=True)
    torch.testing.assert_close(hf.model.forward_reference(ids), same.forward_reference(ids), rtol=0, atol=1e-5)
    assert generate(hf, ids, 16, ignore_eos=True) == generate(LoadedModel(same, src.tokenizer, src.config, "x"), ids,
                                                               16, ignore_eos=True)


def test_a_scale_that_does_not_tile_the_weight_is_refused():
    w = torch.zeros(64, 48).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="does not tile"):
        dequantize_fp8(w, torch.ones(2, 1), (32, 32))


def test_fp8_without_its_scale_is_a_typed_error(tmp_path, src):
    write_checkpoint(src, tmp_path)
    from safetensors.torch import load_file

    sd = load_file(str(tmp_path / "model.safetensors"))
    del sd[FP8_NAME + "_scale_inv"]
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(UnsupportedCheckpoint, match="scale_inv"):
        load_model(str(tmp_path))


def test_the_ds_v3_preset_config_maps_to_the_engine_config():
    _, c = load_config("ds-v3")
    cfg = deepseek_config(c, name="ds-v3", dtype="bfloat16")
    assert (cfg.mla.kv_lora_rank, cfg.mla.qk_rope_head_dim, cfg.mla.q_lora_rank) == (512, 64, 1536)
    assert (cfg.moe.n_routed_experts, cfg.moe.n_group, cfg.moe.topk_group, cfg.moe.experts_per_token) == (256, 8, 4, 8)
    assert cfg.moe.first_k_dense_replace == 3 and cfg.moe.routed_scaling_factor == 2.5
    assert cfg.yarn is not None and cfg.yarn.factor == 40 and cfg.yarn.original_max_position == 4096
    assert cfg.kv_cache_container == (1, 288)


def test_a_softmax_router_is_refused_naming_the_key():
    _, c = load_config("ds-v3")
    with pytest.raises(UnsupportedCheckpoint, match="scoring_func 'softmax'"):
        deepseek_config({**c, "scoring_func": "softmax"}, name="v2-like")
