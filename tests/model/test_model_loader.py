"""load_model: seeded random init, HF directories (Llama, Qwen2), GGUF layout, reference generation."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from shared.model import reference
from shared.model.loader import LoadedModel, load_model
from shared.model.specs import UnknownModelSpec
from shared.model.tokenizer_build import byte_alphabet

pytestmark = pytest.mark.model
torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
FINGERPRINT = (
    "import hashlib, torch; from shared.model.loader import load_model; m = load_model('tiny', seed={seed}).model; "
    "print(hashlib.sha256(b''.join(t.numpy().tobytes() for _, t in sorted(m.state_dict().items()))).hexdigest())"
)


def _fingerprint(lm: LoadedModel) -> str:
    sd = sorted(lm.model.state_dict().items())
    return hashlib.sha256(b"".join(t.numpy().tobytes() for _, t in sd)).hexdigest()


def test_tiny_is_identical_across_processes():
    here = load_model("tiny", seed=3)
    there = subprocess.run(
        [sys.executable, "-c", FINGERPRINT.format(seed=3)], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert there == _fingerprint(here)
    assert _fingerprint(load_model("tiny", seed=4)) != there
    assert here.model_id == "tiny2@seed3" and here.config.vocab_size == here.tokenizer.vocab_size


def test_random_spec_builds_the_requested_shape():
    lm = load_model('random:{"n_layers": 2, "hidden_size": 64, "n_heads": 8, "n_kv_heads": 1, "head_dim": 8}', seed=5)
    assert (lm.config.n_layers, lm.config.hidden_size, lm.config.n_kv_heads) == (2, 64, 1)
    assert lm.model.layers[0].self_attn.k_proj.weight.shape == (8, 64)
    assert lm.model_id.startswith("random-") and lm.model_id.endswith("@seed5")
    assert lm.model.forward_reference([1, 2, 3]).shape == (3, 259)


def test_unknown_spec_is_a_typed_error(tmp_path):
    with pytest.raises(UnknownModelSpec):
        load_model(str(tmp_path / "nope"))


def _write_hf_dir(lm: LoadedModel, d: Path, model_type: str) -> None:
    c = lm.config
    sd = {f"model.{k}": v.contiguous() for k, v in lm.model.state_dict().items() if not k.startswith("lm_head")}
    if not c.tie_embeddings:
        sd["lm_head.weight"] = lm.model.lm_head.weight.contiguous()
    save_file(sd, str(d / "model.safetensors"))
    config = dict(
        model_type=model_type, vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads,
        rope_theta=c.rope_theta, rms_norm_eps=c.rms_eps, max_position_embeddings=c.max_position,
        tie_word_embeddings=c.tie_embeddings, bos_token_id=256, eos_token_id=[258],
    )
    (d / "config.json").write_text(json.dumps(config))
    lm.tokenizer.inner.save(str(d / "tokenizer.json"))
    tc = {"chat_template": lm.tokenizer.chat_template, "eos_token": {"content": "<|im_end|>"}, "bos_token": "<|endoftext|>"}
    (d / "tokenizer_config.json").write_text(json.dumps(tc))


@pytest.mark.parametrize(
    ("model_type", "shape"),
    [("llama", '{"tie_embeddings": false}'), ("qwen2", '{"attn_bias": true, "n_kv_heads": 1}')],
)
def test_hf_directory_loads_and_matches_the_source_model(tmp_path, model_type, shape):
    src = load_model(f"random:{shape}", seed=8)
    _write_hf_dir(src, tmp_path, model_type)
    hf = load_model(str(tmp_path))
    assert hf.config.attn_bias == src.config.attn_bias and hf.config.tie_embeddings == src.config.tie_embeddings
    assert hf.config.eos_ids == (258,) and hf.config.bos_id == 256
    ids = hf.tokenizer.encode("héllo, paged world")
    assert ids == src.tokenizer.encode("héllo, paged world")
    torch.testing.assert_close(hf.model.forward_reference(ids), src.model.forward_reference(ids), atol=1e-5, rtol=0)
    assert hf.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]).startswith("<|im_start|>user\nhi")
    assert hf.model_id == tmp_path.name


def _llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to HF Q/K rows (rotate-half -> interleaved pairs)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(lm: LoadedModel, path: Path) -> None:
    c = lm.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.n_layers)
    w.add_context_length(c.max_position)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.n_heads)
    w.add_head_count_kv(c.n_kv_heads)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.rms_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list([*byte_alphabet(), "<|endoftext|>", "<|im_start|>", "<|im_end|>", "he"])
    w.add_token_types([1] * 256 + [3, 3, 3, 1])
    w.add_token_merges(["h e"])
    w.add_bos_token_id(256)
    w.add_eos_token_id(258)
    w.add_chat_template(lm.tokenizer.chat_template)
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}  # fmt: skip
    heads = {"attn_q": c.n_heads, "attn_k": c.n_kv_heads}
    for k, v in lm.model.state_dict().items():
        a = v.numpy().astype(np.float32)
        if k.startswith("layers."):
            _, i, rest = k.split(".", 2)
            mod, kind = rest.rsplit(".", 1)
            g = names[mod]
            a = _llama_cpp_permute(a, heads[g]) if g in heads else a
            w.add_tensor(f"blk.{i}.{g}.{kind}", a)
        else:
            w.add_tensor({"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}[k], a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_with_llama_cpp_permuted_qk_loads_to_the_same_model(tmp_path):
    src = load_model('random:{"vocab_size": 260, "tie_embeddings": true}', seed=9)
    path = tmp_path / "tiny.gguf"
    _write_gguf(src, path)
    lm = load_model(str(path))
    assert lm.config.vocab_size == 260 and lm.config.tie_embeddings and lm.config.eos_ids == (256, 258)
    assert lm.tokenizer.encode("hello") == [259, 108, 108, 111]  # the one merge applied
    ids = [259, 108, 108, 111, 44, 32, 257]
    torch.testing.assert_close(lm.model.forward_reference(ids), src.model.forward_reference(ids), atol=1e-5, rtol=0)
    assert lm.model_id == "tiny"


def test_reference_generate_equals_greedy_over_full_recompute():
    lm = load_model("tiny", seed=2)
    prompt = lm.tokenizer.encode("The quick brown fox")
    out = reference.generate(lm, prompt, 12, ignore_eos=True, block_size=4)
    seq = list(prompt)
    for _ in range(12):
        seq.append(int(lm.model.forward_reference(seq)[-1].argmax()))
    assert out == seq[len(prompt) :]


def test_reference_generate_stops_at_eos_and_is_seeded():
    lm = load_model("tiny", seed=2)
    free = reference.generate(lm, [1, 2, 3], 10, ignore_eos=True)
    stop_at = free[3]  # declare the 4th greedy token an end-of-sequence id
    ends = dataclasses.replace(lm, config=dataclasses.replace(lm.config, eos_ids=(stop_at,)))
    assert reference.generate(ends, [1, 2, 3], 10) == free[: free.index(stop_at) + 1]
    a = reference.generate(lm, [1, 2, 3], 10, temperature=1.0, seed=11, ignore_eos=True)
    b = reference.generate(lm, [1, 2, 3], 10, temperature=1.0, seed=11, ignore_eos=True)
    assert a == b and len(a) == 10
