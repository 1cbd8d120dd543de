"""A storage-bound node: reads queue for longer than the transfer deadline, and still succeed.

The deadline exists to catch a dead traffic-manager or gateway, not a busy storage NIC:
the TM adds the announced (and its own outstanding) read queue of the node to the
deadline of each storage read, and tells the prefill engine (`ReadQueued`), whose
fetch deadline waits for the queue too.
"""
from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest

from tests.integration.meshutil import tiny_mesh, wait_stored

pytestmark = pytest.mark.integration

PROMPTS = 10


def _resumes(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("dualpath_scheduler_request_resumes_total "):
            return float(line.split()[1])
    return 0.0


def test_reads_queued_past_the_deadline_are_not_failed(tmp_path, reference):
    from shared.engine.store_layout import prompt_keys, store_layout

    layout = store_layout(reference.model_id, reference.config, 64)
    # reads at 2.5 MB/s: ten 10-block (1.3 MB) hit prefixes queue for ~5 s; deadlines are 2 s
    mesh = tiny_mesh(tmp_path, kv_blocks=256, buffer_mb=64,
                     # second turns read from storage, not from the first turns' blocks the DE kept
                     extra={"scheduler": {"liveness-timeout-s": "3", "pe-beta-tokens": "100000",
                                          "serve-pending-saves": "false"},
                            "storage_gateway": {"snic-read-gbps": "0.02"},
                            "prefill_engine": {"handoff-timeout-s": "2"},
                            "traffic_manager": {"transfer-timeout-s": "2"}})
    mesh.start(timeout=120)
    try:
        prompts = [f"[queue {i} {uuid.uuid4().hex[:6]}] " + "read; think; " * 55 for i in range(PROMPTS)]

        async def turn(client, prompt, max_tokens):
            r = await client.post(mesh.url + "/v1/completions", json={
                "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "dualpath_mode": "basic", "return_token_ids": True})
            assert r.status_code == 200, r.text
            return r.json()

        async def run():
            async with httpx.AsyncClient(timeout=120) as client:
                firsts = await asyncio.gather(*(turn(client, p, 4) for p in prompts))
                for f in firsts:  # persistence (writes are uncapped) lands: every block is a file
                    ids = f["choices"][0]["prompt_token_ids"] + f["choices"][0]["token_ids"][:-1]
                    await asyncio.to_thread(wait_stored, tmp_path / "store", prompt_keys(layout, ids))
                t0 = time.monotonic()
                seconds = await asyncio.gather(*(turn(client, p + f["choices"][0]["text"], 4)
                                                 for p, f in zip(prompts, firsts)))
                return seconds, time.monotonic() - t0

        seconds, took = asyncio.run(run())
        cached = [s["usage"]["prompt_tokens_details"]["cached_tokens"] for s in seconds]
        assert min(cached) >= 8 * 64, cached  # every second turn read its prefix from storage
        assert took > 3.0, f"the reads did not queue past the 2 s deadline ({took:.1f}s): test is void"
        assert _resumes(mesh.url) == 0  # none failed at a deadline and was resumed elsewhere
    finally:
        mesh.stop()
