"""Stored KV-cache through the mesh: multi-turn reuse, exact outputs, restarts, corruption."""
from __future__ import annotations

import httpx
import pytest

from tests.integration.meshutil import complete, tiny_mesh, wait_stored

pytestmark = pytest.mark.integration

TURN1 = "You are a coding agent. Tool output follows. " + "def f(x): return x * 2  # ok\n" * 14


def _ask(mesh, prompt, n=16):
    r = complete(mesh.url, {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                            "return_token_ids": True})
    assert r.status_code == 200, r.text
    return r.json()


def test_second_turn_reuses_stored_blocks_and_matches(tmp_path, reference):
    from shared.engine.store_layout import prompt_keys, store_layout
    from shared.model.reference import generate

    layout = store_layout(reference.model_id, reference.config, 64)
    mesh = tiny_mesh(tmp_path, kv_blocks=96)
    store = tmp_path / "store"
    mesh.start(timeout=120)
    try:
        t1 = _ask(mesh, TURN1, 70)
        assert t1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        cached_ids = t1["choices"][0]["prompt_token_ids"] + t1["choices"][0]["token_ids"][:-1]  # KV in the cache
        wait_stored(store, prompt_keys(layout, cached_ids))  # persistence is background work
        turn2 = TURN1 + t1["choices"][0]["text"] + "\nTool: tests passed. Next step?\n"
        t2 = _ask(mesh, turn2)
        cached = t2["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= 64 * (t1["usage"]["prompt_tokens"] // 64), cached
        assert cached % 64 == 0 and cached < t2["usage"]["prompt_tokens"], t2["usage"]
        want = generate(reference, t2["choices"][0]["prompt_token_ids"], 16, ignore_eos=True)
        assert t2["choices"][0]["token_ids"] == want  # same tokens as with an empty store
        metrics = httpx.get(mesh.url + "/metrics", timeout=5).text
        assert "dualpath_scheduler_cached_prompt_tokens_total" in metrics
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
        keys = prompt_keys(layout, t2["choices"][0]["prompt_token_ids"])
        victim = next(store.rglob(keys[3].hex() + ".kvb"))  # the 4th block of the prompt's chain
        data = bytearray(victim.read_bytes())
        data[-100] ^= 0xFF
        victim.write_bytes(bytes(data))
        t3 = _ask(mesh, turn2)
        assert t3["choices"][0]["token_ids"] == want
        assert t3["usage"]["prompt_tokens_details"]["cached_tokens"] == 3 * 64  # the chain stops at the bad block
        # removed, or already replaced by the block the resumed prefill recomputed and persisted
        assert not victim.exists() or victim.read_bytes() != bytes(data), "the corrupt block was not removed"
    finally:
        mesh.stop()


def test_with_front_door_workers_the_workers_hit_lookup_serves_the_second_turn(tmp_path, reference):
    """The worker asks the store (the dispatch core makes no round trip): its count reaches the
    assignment, so the second turn loads its stored blocks, with the same tokens."""
    from shared.engine.store_layout import prompt_keys, store_layout
    from shared.model.reference import generate

    layout = store_layout(reference.model_id, reference.config, 64)
    mesh = tiny_mesh(tmp_path, kv_blocks=96, extra={"scheduler": {"liveness-timeout-s": "2", "front-workers": "1"}})
    mesh.start(timeout=120)
    try:
        t1 = _ask(mesh, TURN1, 70)
        ids = t1["choices"][0]["prompt_token_ids"] + t1["choices"][0]["token_ids"][:-1]
        wait_stored(tmp_path / "store", prompt_keys(layout, ids))
        t2 = _ask(mesh, TURN1 + t1["choices"][0]["text"] + "\nTool: tests passed. Next step?\n")
        assert t2["usage"]["prompt_tokens_details"]["cached_tokens"] >= 64 * (t1["usage"]["prompt_tokens"] // 64)
        assert t2["choices"][0]["token_ids"] == generate(reference, t2["choices"][0]["prompt_token_ids"], 16,
                                                         ignore_eos=True)
    finally:
        mesh.stop()
