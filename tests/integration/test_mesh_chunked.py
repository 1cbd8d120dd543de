"""Chunked prefill under a small compute quota: outputs stay exact (tokens and logprobs), with
and without stored KV."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.integration.exactness import ask, assert_exact, wait_stored
from tests.integration.meshutil import tiny_mesh

pytestmark = pytest.mark.integration


def test_chunked_prefill_is_exact_and_reuses_the_store(tmp_path, reference):
    extra = {"prefill_engine": {"compute-quota-s": "0.25"}, "scheduler": {"liveness-timeout-s": "2"}}
    mesh = tiny_mesh(tmp_path, kv_blocks=96, extra=extra)  # ~120 tokens per forward
    mesh.start(timeout=120)
    try:
        prompt = "chunk me please; " * 45  # 765 tokens: about 7 forwards
        r1 = ask(mesh.url, prompt, 20)
        assert_exact(r1, reference, what="chunked prefill, empty store")
        ids = r1["choices"][0]["prompt_token_ids"] + r1["choices"][0]["token_ids"]
        wait_stored(Path(mesh.spec.store), reference, ids, (len(ids) - 1) // 64)
        turn2 = ids + reference.tokenizer.encode(" and a new tool result" * 10)
        r2 = ask(mesh.url, turn2, 12)
        assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] >= 704
        assert_exact(r2, reference, turn2, what="chunked prefill with a store hit")
        forwards = [line for line in httpx.get(_metrics_url(mesh), timeout=5)
                    .text.splitlines() if line.startswith("dualpath_prefill_engine_step_seconds_count")]
        assert float(forwards[0].split()[-1]) >= 7  # the long prompt really was chunked
    finally:
        mesh.stop()


def _metrics_url(mesh) -> str:
    body = httpx.get(mesh.url + "/v1/mesh", timeout=5).json()
    return next(e["metrics_url"] for e in body["engines"] if e["role"] == "prefill")
