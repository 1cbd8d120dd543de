"""Chunked prefill under a small compute quota (spec 7.5): outputs stay exact, with and without stored KV."""
from __future__ import annotations

import time

import httpx
import pytest

from tests.integration.meshutil import complete, tiny_mesh

pytestmark = pytest.mark.integration


def test_chunked_prefill_is_exact_and_reuses_the_store(tmp_path):
    import torch

    from shared.model.loader import load_model
    from shared.model.reference import generate

    torch.set_num_threads(1)
    ref = load_model("tiny", seed=0)
    extra = {"prefill_engine": {"compute-quota-s": "0.25"}, "scheduler": {"liveness-timeout-s": "2"}}
    mesh = tiny_mesh(tmp_path, kv_blocks=96, extra=extra)  # ~120 tokens per forward
    mesh.start(timeout=120)
    try:
        prompt = "chunk me please; " * 45  # 765 tokens: about 7 forwards
        r1 = complete(mesh.url, {"prompt": prompt, "max_tokens": 20, "temperature": 0, "ignore_eos": True,
                                 "return_token_ids": True}).json()
        ids = r1["choices"][0]["prompt_token_ids"]
        assert r1["choices"][0]["token_ids"] == generate(ref, ids, 20, ignore_eos=True)
        time.sleep(0.6)
        turn2 = prompt + r1["choices"][0]["text"] + " and a new tool result" * 10
        r2 = complete(mesh.url, {"prompt": turn2, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                                 "return_token_ids": True}).json()
        assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] >= 704
        assert r2["choices"][0]["token_ids"] == generate(ref, r2["choices"][0]["prompt_token_ids"], 12,
                                                          ignore_eos=True)
        forwards = [line for line in httpx.get(_metrics_url(mesh), timeout=5)
                    .text.splitlines() if line.startswith("dualpath_prefill_step_seconds_count")]
        assert float(forwards[0].split()[-1]) >= 7  # the long prompt really was chunked
    finally:
        mesh.stop()


def _metrics_url(mesh) -> str:
    body = httpx.get(mesh.url + "/v1/mesh", timeout=5).json()
    return next(e["metrics_url"] for e in body["engines"] if e["role"] == "prefill")
