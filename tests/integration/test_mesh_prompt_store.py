"""Every full block of every prompt is stored, whatever ends the request, and another request
that shares the prefix seconds later reuses it: a prompt whose only token came from the
prefill (max_tokens 1), one cut by a stop string at its first token, one whose client left
after the first streamed token. Prefixes are shared across requests, not only across the
turns of one conversation.
"""
from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest

from tests.integration.exactness import wait_stored
from tests.integration.meshutil import complete, tiny_mesh

pytestmark = pytest.mark.integration
BLOCK = 64


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    m = tiny_mesh(tmp_path_factory.mktemp("store"), kv_blocks=128)
    m.start(timeout=120)
    yield m
    m.stop()


def _ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(32, 127) for _ in range(n)]


def _cached(mesh, prompt: list[int], mode: str = "dualpath") -> int:
    r = complete(mesh.url, {"prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True,
                            "dualpath_mode": mode})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def _reused_by_another_request(mesh, reference, prompt: list[int], blocks: int, seed: int,
                               mode: str = "dualpath") -> None:
    """The prompt's full blocks reach the store; a different request sharing them hits them all."""
    wait_stored(Path(mesh.spec.store), reference, prompt, blocks)
    other = prompt[:blocks * BLOCK] + _ids(3 * BLOCK + 5, seed + 1000)  # another user's question on the prefix
    assert _cached(mesh, other, mode) == blocks * BLOCK


@pytest.mark.parametrize("mode", ["dualpath", "basic"])
def test_a_prompt_answered_by_the_prefill_alone_is_stored(mesh, reference, mode):
    prompt = _ids(10 * BLOCK + 20, seed=len(mode))
    r = complete(mesh.url, {"prompt": prompt, "max_tokens": 1, "temperature": 0, "dualpath_mode": mode})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 1
    _reused_by_another_request(mesh, reference, prompt, 10, seed=len(mode), mode=mode)


def test_a_prompt_cut_by_a_stop_string_at_its_first_token_is_stored(mesh, reference):
    import torch

    prompt = _ids(8 * BLOCK + 3, seed=7)
    with torch.inference_mode():
        first = int(reference.model.forward_reference(prompt)[-1].argmax())
    stop = reference.tokenizer.decode([first])
    r = complete(mesh.url, {"prompt": prompt, "max_tokens": 40, "temperature": 0, "ignore_eos": True,
                            "stop": [stop]})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "stop" and r.json()["choices"][0]["text"] == ""
    _reused_by_another_request(mesh, reference, prompt, 8, seed=7)


def test_a_prompt_whose_client_left_after_the_first_token_is_stored(mesh, reference):
    prompt = _ids(9 * BLOCK + 11, seed=9)
    body = {"prompt": prompt, "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", mesh.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # the first token is out: the client leaves
    _reused_by_another_request(mesh, reference, prompt, 9, seed=9)
