"""Stored KV-cache through the mesh: multi-turn reuse, exact outputs, restarts, corruption."""
from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.integration.meshutil import complete, tiny_mesh

pytestmark = pytest.mark.integration

TURN1 = "You are a coding agent. Tool output follows. " + "def f(x): return x * 2  # ok\n" * 14


def _ask(mesh, prompt, n=16):
    r = complete(mesh.url, {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                            "return_token_ids": True})
    assert r.status_code == 200, r.text
    return r.json()


def _wait_persisted(store: Path, at_least: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    n = 0
    while time.monotonic() < deadline:
        n = len(list(store.rglob("*.kvb")))
        if n >= at_least:
            return n
        time.sleep(0.1)
    return n


def test_second_turn_reuses_stored_blocks_and_matches(tmp_path, reference):
    from shared.model.reference import generate

    mesh = tiny_mesh(tmp_path, kv_blocks=96)
    store = tmp_path / "store"
    mesh.start(timeout=120)
    try:
        t1 = _ask(mesh, TURN1, 70)
        assert t1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        full_blocks = (t1["usage"]["prompt_tokens"] + 70 - 1) // 64  # prompt + generated KV in the cache
        assert _wait_persisted(store, full_blocks) >= full_blocks
        turn2 = TURN1 + t1["choices"][0]["text"] + "\nTool: tests passed. Next step?\n"
        t2 = _ask(mesh, turn2)
        cached = t2["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= 64 * (t1["usage"]["prompt_tokens"] // 64), cached
        assert cached % 64 == 0 and cached < t2["usage"]["prompt_tokens"], t2["usage"]
        want = generate(reference, t2["choices"][0]["prompt_token_ids"], 16, ignore_eos=True)
        assert t2["choices"][0]["token_ids"] == want  # same tokens as with an empty store
        metrics = httpx.get(mesh.url + "/metrics", timeout=5).text
        assert "dualpath_cached_prompt_tokens_total" in metrics
    finally:
        mesh.stop()

    # every service restarted: the store persists and serves the same answer
    mesh = tiny_mesh(tmp_path / "again", kv_blocks=96, store=str(store))
    mesh.start(timeout=120)
    try:
        t2b = _ask(mesh, turn2)
        assert t2b["usage"]["prompt_tokens_details"]["cached_tokens"] >= cached
        assert t2b["choices"][0]["token_ids"] == want

        # corrupt one stored block of the chain: it is a miss (recomputed), never wrong output
        from shared.engine.store_layout import prompt_keys, store_layout

        layout = store_layout(reference.model_id, reference.config, 64)
        keys = prompt_keys(layout, t2["choices"][0]["prompt_token_ids"])
        victim = next(store.rglob(keys[3] + ".kvb"))  # the 4th block of the prompt's chain
        data = bytearray(victim.read_bytes())
        data[-100] ^= 0xFF
        victim.write_bytes(bytes(data))
        t3 = _ask(mesh, turn2)
        assert t3["choices"][0]["token_ids"] == want
        assert t3["usage"]["prompt_tokens_details"]["cached_tokens"] == 3 * 64  # the chain stops at the bad block
        assert not victim.exists(), "the corrupt block was not removed"
    finally:
        mesh.stop()
