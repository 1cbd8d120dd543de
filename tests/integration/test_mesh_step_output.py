"""Decode output per step: a decode engine publishes one StepEvents per step per reply subject,
carrying every running sequence of that subject; nothing per token.

The test plays two schedulers: it hands prefill work straight to the prefill engine with two
reply subjects (A, B) and listens on both. Request a0 (subject A) decodes long; once it is
decoding, a1 (A) and b1 (B) join it; when they are done a0 is cancelled. a0 runs in every step
of that window, so subject A gets exactly one message per engine step (the engine's own
`decode_step_seconds_count`), each a1 token shares its message with an a0 token, and B's
messages carry b1 alone.
"""
from __future__ import annotations

import asyncio
import re
import time

import httpx
import nats
import pytest

from shared.messages import stream
from shared.messages.endpoints import EP
from shared.messages.stream import StepEvents, TokenEvent
from shared.messages.work import Cancel, PrefillWork, Sampling
from tests.integration.meshutil import tiny_mesh

pytestmark = pytest.mark.integration

PROMPT = list(range(40, 70))


def metric(url: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", httpx.get(url, timeout=10).text, re.M)
    assert found, f"{name} not on {url}"
    return float(found.group(1))


async def until(pred, what: str, timeout: float = 60.0):
    """Poll `pred()` until truthy (the timeout is only a hang guard)."""
    deadline = time.monotonic() + timeout
    while not (got := pred()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.02)
    return got


class Listener:
    """Every message on the two reply subjects, decoded with the output subject's decoder."""

    def __init__(self):
        self.got: dict[str, list[TokenEvent | StepEvents]] = {"A": [], "B": []}

    def on(self, key: str):
        async def cb(m):
            self.got[key].append(stream.decoder.decode(m.data))
        return cb

    def steps(self, key: str) -> list[StepEvents]:
        return [m for m in self.got[key] if isinstance(m, StepEvents)]

    def tokens(self, req: str) -> list[TokenEvent]:
        """Every event of `req` in arrival order (the PE's first token, then step entries)."""
        out = []
        for msgs in self.got.values():
            for m in msgs:
                out += [e for e in (m.events if isinstance(m, StepEvents) else [m]) if e.req_id == req]
        return out

    def finished(self, req: str) -> bool:
        return any(e.finish for e in self.tokens(req))


def test_decode_publishes_one_message_per_step_per_reply_subject(tmp_path):
    mesh = tiny_mesh(tmp_path)
    mesh.start(timeout=120)
    try:
        asyncio.run(_scenario(mesh))
    finally:
        mesh.stop()


async def _scenario(mesh) -> None:
    ns = mesh.spec.namespace
    view = httpx.get(mesh.url + "/v1/mesh", timeout=10).json()
    pe = next(e for e in view["engines"] if e["role"] == "prefill")
    de = next(e for e in view["engines"] if e["role"] == "decode")
    subj = {"A": EP.SCHED_OUT.at(ns, scheduler="test-a"), "B": EP.SCHED_OUT.at(ns, scheduler="test-b")}
    nc = await nats.connect(mesh.nats_url)
    try:
        lis = Listener()
        for key, s in subj.items():
            await nc.subscribe(s, cb=lis.on(key))
        await nc.flush()
        steps0, tokens0 = (metric(de["metrics_url"], "dualpath_decode_engine_step_seconds_count"),
                           metric(de["metrics_url"], "dualpath_decode_engine_tokens_total"))

        async def work(req: str, key: str, max_tokens: int) -> None:
            sampling = Sampling(max_tokens=max_tokens, ignore_eos=True)
            await nc.publish(EP.PE_WORK.at(ns, engine=pe["engine"]), stream.encoder.encode(
                PrefillWork(req, PROMPT, sampling, de["engine"], str(subj[key]))))

        await work("a0", "A", 48 * 64 - len(PROMPT))  # 48 of the DE's 64 KV blocks: room for a1 and b1
        await until(lambda: any(e.index >= 2 for e in lis.tokens("a0")), "a0 decoding")
        await work("a1", "A", 24)
        await work("b1", "B", 24)
        await until(lambda: lis.finished("a1") and lis.finished("b1"), "a1 and b1 finished")
        assert not lis.finished("a0"), "a0 ended before a1 and b1: the scenario needs it running throughout"
        await nc.publish(EP.CANCEL.at(ns), stream.encoder.encode(Cancel("a0", "test done")))
        await until(lambda: metric(de["metrics_url"], "dualpath_decode_engine_running") == 0, "a0 leaving the batch")
        steps = metric(de["metrics_url"], "dualpath_decode_engine_step_seconds_count") - steps0
        tokens = metric(de["metrics_url"], "dualpath_decode_engine_tokens_total") - tokens0
        await until(lambda: len(lis.steps("A")) >= steps, f"{steps:.0f} step messages on A")
        await nc.flush()
    finally:
        await nc.close()

    on_a, on_b = lis.steps("A"), lis.steps("B")
    assert len(on_a) == steps  # one message per step on A (a0 ran in every step), not one per token
    assert sum(len(m.events) for m in on_a + on_b) == tokens  # every token of every step, once
    assert all({e.req_id for e in m.events} <= {"a0", "a1"} for m in on_a)
    assert all([e.req_id for e in m.events] == ["b1"] for m in on_b)
    assert all(m.source == de["engine"] for m in on_a + on_b)
    with_a1 = [m for m in on_a if any(e.req_id == "a1" for e in m.events)]
    assert len(with_a1) == 23 and all(len(m.events) == 2 for m in with_a1)  # a1 shares a0's messages
    for req in ("a1", "b1"):  # the PE's first token (index 0), then one token per step, in order
        evs = lis.tokens(req)
        assert [e.index for e in evs] == list(range(24)) and all(len(e.tokens) == 1 for e in evs)
        assert [bool(e.finish) for e in evs] == [False] * 23 + [True] and evs[-1].finish == "length"
