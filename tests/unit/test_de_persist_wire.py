"""What the decode engine's persister asks of its traffic manager (`SaveKV`: blocks, keys, slots,
subject, deadline, context, the abort on the TM's loss), what it counts, when it lets a released
request's KV blocks go (after its last save was copied), and how a broken save ends its request."""
from __future__ import annotations

import asyncio

import pytest

from services.decode_engine.persist import Persister
from services.decode_engine.running import RunningSeq
from shared.bus import BusError
from shared.engine.requests import EngineRequest
from shared.kv.hashing import chain_hash
from shared.messages.storage_gateway import StoreLayout
from shared.messages.traffic_manager import SaveCopied, SaveKV
from shared.messages.work import DecodeAdmit, Sampling
from shared.metrics import Metrics

pytestmark = pytest.mark.unit
BS = 4
LAYOUT = StoreLayout(b"f" * 16, "m", 2, 1, 8, "float32", BS)
SUBJECT = "t.traffic_manager.de-1.save"
KEYS = [bytes([i]) * 16 for i in range(6)]
CTX = object()  # the request's trace context, passed on as is


class Bus:
    """The TM's save endpoint: answers with `answer(msg)` once `gate` opens."""

    def __init__(self, answer=lambda msg: SaveCopied(len(msg.block_keys))):
        self.asked: list[tuple[str, SaveKV, float, object, object]] = []
        self.answer, self.gate = answer, None

    async def request(self, subject, msg, timeout=None, ctx=None, abort=None):
        self.asked.append((subject, msg, timeout, ctx, abort))
        if self.gate is not None:
            await self.gate.wait()
        return self.answer(msg)


class Harness:
    def __init__(self, bus: Bus):
        self.bus, self.metrics, self.names, self.tasks = bus, Metrics("decode_engine"), [], []
        self.released, self.failures = [], []
        self.p = Persister(LAYOUT, "n1", bus, SUBJECT, 3.5, self.spawn, self.metrics,
                           release=self.released.append, on_failure=lambda req, why: self.failures.append(why))

    def spawn(self, coro, name=None):
        self.names.append(name)
        task = asyncio.ensure_future(coro)
        self.tasks.append(task)
        return task

    def counted(self, name: str) -> float:
        return self.metrics.registry.get_sample_value(f"dualpath_decode_engine_{name}")


def _req(prompt_len: int = 10) -> EngineRequest:
    return EngineRequest("r#0", list(range(100, 100 + prompt_len)), Sampling(), "out", CTX, blocks=[40, 41, 42, 43])


def _admit(prompt_len: int, keys: int, slots: int, persisted: int = 0) -> DecodeAdmit:
    return DecodeAdmit("r#0", prompt_len, 7, Sampling(), "out", [(20 + i) * 64 for i in range(slots)],
                       block_keys=KEYS[:keys], persisted_blocks=persisted)


@pytest.mark.parametrize("prompt_len, keys, slots, persisted, saved", [
    (3 * BS + 2, 5, 5, 1, (1, 3)),  # the prompt's full blocks bound it
    (5 * BS, 2, 5, 0, (0, 2)),  # the keys known
    (5 * BS, 5, 3, 1, (1, 3)),  # the slots it arrived in
    (5 * BS, 5, 5, 5, None),  # all stored already: nothing to save
    (5 * BS, 5, 5, 7, None),
])
def test_on_admission_the_prompts_missing_blocks_are_saved_from_their_slots(prompt_len, keys, slots, persisted, saved):
    bus = Bus(lambda msg: SaveCopied(len(msg.block_keys), error="partly"))
    h = Harness(bus)
    admit = _admit(prompt_len, keys, slots, persisted)
    why = asyncio.run(h.p.claim_prompt(_req(prompt_len), admit))
    if saved is None:
        assert (why, bus.asked) == ("", [])
        return
    a, b = saved
    (subject, msg, timeout, ctx, abort), = bus.asked
    assert msg == SaveKV("r#0", [], KEYS[a:b], "n1", LAYOUT, slots=admit.buf_slots[a:b])
    assert (subject, timeout, ctx) == (SUBJECT, 3.5, CTX) and abort is not None and abort.done() is False
    assert why == "partly" and h.counted("persisted_blocks_total") == b - a


def test_a_lost_claim_says_why():
    async def go(h):
        h.p.tm.lost()  # the TM's connection dropped: a save in flight fails at once
        return await h.p.claim_prompt(_req(), _admit(3 * BS, 3, 3))

    def answer(msg):
        raise BusError("save", "TM gone")
    assert asyncio.run(go(Harness(Bus(answer)))) == "TM gone"


def test_the_prompt_keys_are_those_of_its_full_blocks():
    seq = RunningSeq(_req(2 * BS + 3), 2 * BS + 3, 7, 64)
    Harness(Bus()).p.prompt(seq, _admit(2 * BS + 3, 4, 4))
    assert seq.keys == KEYS[:2]


def test_generated_blocks_are_keyed_on_the_chain_and_saved_each_on_its_own():
    async def go():
        bus = Bus()
        bus.gate = asyncio.Event()
        h = Harness(bus)
        seq = RunningSeq(_req(BS - 1), BS - 1, 7, 64)  # no full prompt block: the chain starts at the layout
        seq.req.generated = list(range(200, 200 + 2 * BS))
        h.p.generated(seq, 0)
        h.p.generated(seq, 1)
        h.p.generated(seq, 3)  # a gap: not keyed
        h.p.release_later(seq.req)
        assert h.p.busy("r#0") and h.released == []
        bus.gate.set()
        await asyncio.gather(*h.tasks)
        return h, seq, bus
    h, seq, bus = asyncio.run(go())
    k0 = chain_hash(LAYOUT.fingerprint, seq.context(0, BS))
    k1 = chain_hash(k0, seq.context(BS, 2 * BS))
    assert seq.keys == [k0, k1]
    assert [(s, m, t, c) for s, m, t, c, _ in bus.asked] == [
        (SUBJECT, SaveKV("r#0", [40], [k0], "n1", LAYOUT), 3.5, CTX),
        (SUBJECT, SaveKV("r#0", [41], [k1], "n1", LAYOUT), 3.5, CTX)]
    assert all(a is not None for *_, a in bus.asked)
    assert h.names == ["persist-r#0", "persist-r#0"] and h.counted("persisted_blocks_total") == 2
    assert h.released == [seq.req] and not h.p.busy("r#0") and h.failures == []


def test_the_request_is_released_only_after_its_last_save_was_copied():
    async def go():
        bus = Bus()
        h = Harness(bus)
        seq = RunningSeq(_req(BS - 1), BS - 1, 7, 64)
        seq.req.generated = list(range(200, 200 + 2 * BS))
        gates = [asyncio.Event(), asyncio.Event()]
        answers = iter(gates)

        async def request(subject, msg, timeout=None, ctx=None, abort=None):
            await next(answers).wait()
            return SaveCopied(1)
        bus.request = request
        h.p.generated(seq, 0)
        h.p.generated(seq, 1)
        h.p.release_later(seq.req)
        gates[0].set()
        await asyncio.wait({h.tasks[0]})
        first = (list(h.released), h.p.busy("r#0"))
        gates[1].set()
        await asyncio.gather(*h.tasks)
        return first, h.released, h.p.busy("r#0")
    first, released, busy = asyncio.run(go())
    assert first == ([], True) and len(released) == 1 and not busy


@pytest.mark.parametrize("answer, failed", [
    (lambda msg: SaveCopied(0, error="save line full"), []),  # dropped: no harm to the request
    (lambda msg: (_ for _ in ()).throw(BusError("save", "timed out")), []),
    (lambda msg: (_ for _ in ()).throw(ValueError("bad reply")), ["persisting its KV failed: ValueError: bad reply"]),
])
def test_only_a_broken_save_ends_its_request(answer, failed):
    async def go():
        h = Harness(Bus(answer))
        seq = RunningSeq(_req(BS - 1), BS - 1, 7, 64)
        seq.req.generated = list(range(200, 200 + BS))
        h.p.generated(seq, 0)
        h.p.release_later(seq.req)
        await asyncio.gather(*h.tasks)
        return h
    h = asyncio.run(go())
    assert h.failures == failed and len(h.released) == 1
    assert h.counted("persist_failures_total") == len(failed)
    assert h.counted("persisted_blocks_total") == 0


def test_metrics_are_named_and_described_for_the_dashboards():
    text = Harness(Bus()).metrics.render().decode()
    assert "# HELP dualpath_decode_engine_persisted_blocks_total Full blocks handed to persistence\n" in text
    assert "# HELP dualpath_decode_engine_persist_failures_total Saves that failed unexpectedly\n" in text
