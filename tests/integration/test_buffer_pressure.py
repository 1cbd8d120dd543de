"""Multi-turn agents on both read paths with DRAM buffers far smaller than their prompts' sum.

Two faults this guards against, both found by `dualpath bench` with a small buffer:
a split read that held PE-buffer slots while waiting for DE-buffer slots (and the
reverse, in another request) stalled until the transfer deadline; and DE-buffer slots
staged for a prompt that finished at the prefill engine were never freed.

A stall is made to show as a failure, not as slowness: the traffic-managers' transfer
deadline (120 s) is longer than the prefill engine's fetch deadline (30 s), so a fetch
stalled on buffer slots fails at the prefill engine and is resumed elsewhere, which the
resume counter shows.
"""
from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from tests.integration.meshutil import tiny_mesh, wait_until

pytestmark = pytest.mark.integration

AGENTS, TURNS = 6, 3


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url, timeout=10).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _agent(client: httpx.AsyncClient, url: str, i: int) -> list[int]:
    prompt, cached = f"[agent {i} {uuid.uuid4().hex[:6]}] " + "observe; act; " * 45, []
    for turn in range(TURNS):
        r = await client.post(url + "/v1/completions", json={
            "prompt": prompt, "max_tokens": 1 if turn == 1 else 20, "temperature": 0, "ignore_eos": True,
            "dualpath_mode": "dualpath-split" if i % 3 else "basic"})
        assert r.status_code == 200, r.text
        body = r.json()
        cached.append(body["usage"]["prompt_tokens_details"]["cached_tokens"])
        prompt += body["choices"][0]["text"] + f" result {turn}: ok. " * 4
    return cached


def test_small_buffers_neither_stall_nor_leak(tmp_path):
    mesh = tiny_mesh(tmp_path, buffer_mb=2, kv_blocks=128,  # 16 slots of 128 KiB; prompts of 10+ blocks
                     extra={"scheduler": {"liveness-timeout-s": "2"},
                            "prefill_engine": {"handoff-timeout-s": "30"},
                            "traffic_manager": {"transfer-timeout-s": "120"}})
    mesh.start(timeout=120)
    try:
        async def run() -> list[list[int]]:
            async with httpx.AsyncClient(timeout=60) as client:
                return await asyncio.gather(*(_agent(client, mesh.url, i) for i in range(AGENTS)))

        cached = asyncio.run(run())
        assert any(c[-1] > 0 for c in cached)  # later turns really read stored KV
        m = httpx.get(mesh.url + "/v1/mesh", timeout=10).json()
        resumes = _metric(mesh.url + "/metrics", "dualpath_scheduler_request_resumes_total")
        assert resumes == 0, f"{resumes:g} requests failed at a deadline (a stall on buffer slots) and were resumed"
        for tm in m["traffic_managers"]:  # every buffer slot comes back once persistence drains
            wait_until(lambda: _metric(tm["metrics_url"], "dualpath_traffic_manager_buffer_free_bytes") == 2 * (1 << 20),
                       f"every buffer slot of {tm['engine']}'s traffic-manager to be free")
    finally:
        mesh.stop()
