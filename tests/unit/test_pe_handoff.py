"""The prefill engine's hand-off alone, over a bus that records what it publishes and asks: the first
token's event, the push and admission it sends, the failure it answers, the slots it frees and the
prompt it saves from here."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from opentelemetry import context as otel_context

from services.prefill_engine import handoff as handoff_mod
from services.prefill_engine.batching import Chunk, layerwise_pushes
from services.prefill_engine.config import PrefillEngineConfig
from services.prefill_engine.handoff import Handoff
from services.prefill_engine.life import PeState
from services.prefill_engine.link import PeLink
from services.prefill_engine.outcomes import Fail, Free
from services.prefill_engine.plan_read import PlanLoads
from services.prefill_engine.record import PrefillRequest
from shared.bus import BusError
from shared.kv.window import HitWindow
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.endpoints import EP
from shared.messages.plan import KvPlan
from shared.messages.stream import PromptTiers, TokenEvent, TokenLogprob
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import ForwardAlive, KVWindow, PushDone, PushKV, Release, SaveCopied, SaveKV
from shared.messages.work import Ack, DecodeAdmit, PrefillWork, Sampling
from tests.unit.test_engine_failures import BS, LAYOUT

pytestmark = pytest.mark.unit
SUB = Subjects("t")
KEYS = [bytes([i]) * 16 for i in range(6)]
PROMPT = list(range(6 * BS + 3))  # six full blocks and three tokens
CTX = otel_context.Context({"trace": "mine"})
TIMEOUT = 5.0


@dataclass
class Asked:
    subject: str
    msg: object
    timeout: float
    ctx: object
    abort: object


class HBus:
    """Records publishes (`sent`) and requests (`asked`); a request is answered from `answers` by its
    message's type: a reply, an exception to raise, or an async function of (message, abort)."""

    def __init__(self, **answers):
        self.sent: list[tuple[str, object, object]] = []
        self.asked: list[Asked] = []
        self.answers = {PushKV: PushDone(slots=[0, 4096]), DecodeAdmit: Ack(), SaveKV: SaveCopied(copied=1)}
        self.answers.update({{"push": PushKV, "admit": DecodeAdmit, "save": SaveKV}[k]: v for k, v in answers.items()})

    async def publish(self, subject, msg, ctx=None):
        self.sent.append((subject, msg, ctx))

    async def request(self, subject, msg, timeout=99.0, ctx=None, abort=None):
        self.asked.append(Asked(subject, msg, timeout, ctx, abort))
        answer = self.answers[type(msg)]
        if isinstance(answer, BaseException):
            raise answer
        return await answer(msg, abort) if callable(answer) else answer

    def of(self, kind) -> list:
        return [a for a in self.asked if isinstance(a.msg, kind)]

    def published(self, kind) -> list[tuple[str, object]]:
        return [(s, m) for s, m, _ in self.sent if isinstance(m, kind)]


class Recorder:
    def __init__(self):
        self.values: list[float] = []

    def observe(self, v: float) -> None:
        self.values.append(v)


def handoff(bus: HBus, eos: tuple[int, ...] = (), pm=None, names: list | None = None) -> Handoff:
    def spawn(coro, name=None):
        if names is not None:
            names.append(name)
        return asyncio.ensure_future(coro)
    return Handoff(PeLink(bus, SUB, "pe", spawn), PrefillEngineConfig(handoff_timeout_s=TIMEOUT, node="nA"),
                   LAYOUT, eos, pm)


def request(plan: KvPlan | None = None, prompt=PROMPT, keys=KEYS, **kw) -> PrefillRequest:
    w = PrefillWork("r1", prompt, kw.pop("sampling", Sampling()), "de0", "out", block_keys=keys, plan=plan or KvPlan())
    kw.setdefault("blocks", list(range(10, 17)))
    kw.setdefault("computed", len(prompt))
    return PrefillRequest("r1", prompt, w.sampling, "out", CTX, work=w, **kw)


def pm() -> SimpleNamespace:
    return SimpleNamespace(handoff=Recorder(), tail=Recorder())


async def outcomes(h: Handoff, req: PrefillRequest, first: int = 7, lp=None) -> list:
    return [o async for o in h.run(req, first, lp)]


def at(ep: str, engine: str) -> str:
    return SUB.at(getattr(EP, ep), engine=engine)


# --- the first token --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("first", "sampling", "finish"), [
    (2, Sampling(), FinishReason.STOP),  # an EOS id
    (3, Sampling(stop_token_ids=[3]), FinishReason.STOP),
    (7, Sampling(max_tokens=1), FinishReason.LENGTH),
    (7, Sampling(max_tokens=0), FinishReason.LENGTH),
    (7, Sampling(max_tokens=2), None),
])
def test_the_first_token_is_sent_with_its_finish_and_only_an_unfinished_one_is_handed_over(first, sampling, finish):
    async def go():
        bus = HBus()
        req = request(sampling=sampling, hit_tokens=2 * BS, tiers=PromptTiers(computed=5, engine=32))
        lp = TokenLogprob(-0.5)
        got = await outcomes(handoff(bus, eos=(2,)), req, first, lp)
        ((subject, ev, ctx),) = [(s, m, c) for s, m, c in bus.sent if isinstance(m, TokenEvent)]
        assert (subject, ctx) == ("out", CTX)
        assert ev == TokenEvent("r1", [first], 0, finish=finish, source="pe", cached_tokens=2 * BS,
                                tiers=PromptTiers(computed=5, engine=32), logprobs=[lp])
        assert got == [Free(req)]
        assert bool(bus.of(DecodeAdmit)) is (finish is None)
        # finished here, the prompt is stored from here (past its stored hits); else by the DE it went to
        assert [a.msg.block_keys for a in bus.of(SaveKV)] == ([KEYS[2:]] if finish else [])
    asyncio.run(go())


def test_a_first_token_without_logprobs_carries_none():
    async def go():
        bus = HBus()
        await outcomes(handoff(bus), request())
        ((_, ev),) = bus.published(TokenEvent)
        assert ev.logprobs == [] and ev.finish is None
    asyncio.run(go())


def test_a_cancelled_request_sends_no_token_and_frees_its_push_and_de_slots():
    async def go():
        bus = HBus()
        gate = asyncio.Event()
        req = request(state=PeState.CANCELLING, de_held="de0")
        req.push = asyncio.ensure_future(gate.wait())
        names: list = []
        task = asyncio.ensure_future(outcomes(handoff(bus, names=names), req))
        while not bus.sent:
            await asyncio.sleep(0)
        assert bus.published(Release) == [(at("TM_RELEASE", "pe"), Release("r1"))]  # its own TM stops the push
        assert not bus.of(SaveKV) and not task.done()  # saved once the TM no longer reads the blocks
        gate.set()
        assert await task == [Free(req)]
        assert not bus.published(TokenEvent) and not bus.of(PushKV) and not bus.of(DecodeAdmit)
        while len(bus.published(Release)) < 2:  # the spawned release of its DE slots
            await asyncio.sleep(0)
        assert bus.published(Release)[1:] == [(at("TM_RELEASE", "de0"), Release("r1"))]
        assert names == ["release-de-r1"] and req.de_held == ""
        assert len(bus.of(SaveKV)) == 1
    asyncio.run(go())


def test_a_finished_request_waits_for_its_running_push_before_saving():
    async def go():
        bus = HBus()
        gate = asyncio.Event()
        req = request(sampling=Sampling(max_tokens=1))
        req.push = asyncio.ensure_future(gate.wait())
        task = asyncio.ensure_future(outcomes(handoff(bus), req))
        while not bus.sent:
            await asyncio.sleep(0)
        for _ in range(5):
            await asyncio.sleep(0)
        assert not bus.of(SaveKV) and not bus.published(Release)  # the push is not stopped: it ends by itself
        gate.set()
        assert await task == [Free(req)]
        assert len(bus.of(SaveKV)) == 1 and not bus.published(Release)  # no DE slots held
    asyncio.run(go())


# --- the layerwise push -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["window", "adopt", "de_slots"])
def test_the_layerwise_push_names_the_blocks_the_de_and_the_window(case):
    async def go():
        bus, names = HBus(), []
        window = HitWindow(2, (20, 21), 2, 4, used=1) if case == "window" else None
        req = request(window=window, adopt="pf-1", adopt_blocks=2, de_slots=[0, 4096] if case == "de_slots" else [],
                      de_hits=[1] if case == "de_slots" else [])
        handoff(bus, names=names).start_push(req, expect_s=1.5)
        assert req.de_held == "de0" and names == ["push-r1"]
        await req.push
        (a,) = bus.asked
        assert (a.subject, a.timeout, a.ctx) == (at("TM_PUSH", "pe"), 2 * (TIMEOUT + 1.5), CTX)
        adopt = case != "de_slots"  # copied from the DE's buffer only when no slots were reserved there
        assert a.msg == PushKV("r1", req.blocks, "de0", len(PROMPT), dst_slots=req.de_slots, skip=req.de_hits,
                               layerwise=True, window=KVWindow(2, [20, 21], 2, 1) if window else None,
                               adopt="pf-1" if adopt else "", adopt_block_keys=KEYS[:2] if adopt else [])
        assert req.pushed == PushDone(slots=[0, 4096])
    asyncio.run(go())


@pytest.mark.parametrize("case", ["window", "adopt"])
def test_a_push_after_the_first_token_carries_the_window_and_adoption_the_layerwise_one_would(case):
    async def go():
        bus = HBus()
        window = HitWindow(2, (20, 21), 2, 4, used=1) if case == "window" else None
        req = request(hit_tokens=2 * BS, window=window, adopt="pf-1", adopt_blocks=2,
                      loads=PlanLoads(hits=2, stored=4))
        assert await outcomes(handoff(bus), req) == [Free(req)]
        push = bus.asked[0]
        assert (push.subject, push.ctx) == (at("TM_PUSH", "pe"), CTX)
        assert push.msg == PushKV("r1", req.blocks, "de0", len(PROMPT), layerwise=False,
                                  window=KVWindow(2, [20, 21], 2, 1) if window else None,
                                  adopt="pf-1", adopt_block_keys=KEYS[:2])
    asyncio.run(go())


def test_only_a_forward_expected_long_enough_pushes_layer_by_layer_but_a_windowed_prompt_always_does():
    done, windowed, partial, kept = (request(), request(window=HitWindow(2, (20, 21), 2, 4)), request(),
                                     request(plan=KvPlan(push=False)))
    batch = [Chunk(done, 0, len(PROMPT)), Chunk(windowed, 0, len(PROMPT)), Chunk(partial, 0, len(PROMPT) - 1),
             Chunk(kept, 0, len(PROMPT))]
    assert layerwise_pushes(batch, 0.03, 0.02) == [done, windowed]  # a finishing prompt that pushes
    assert layerwise_pushes(batch, 0.01, 0.02) == [windowed]  # short: whole after the first token
    assert layerwise_pushes(batch, 0.0, 0.0) == [done, windowed]  # 0: always layerwise


@pytest.mark.parametrize("req", [
    lambda: request(plan=KvPlan(push=False)),
    lambda: PrefillRequest("r1", PROMPT, Sampling(), "out", None),
    lambda: request(push=asyncio.get_running_loop().create_future()),
])
def test_no_layerwise_push_without_work_a_plan_that_pushes_or_when_one_runs(req):
    async def go():
        bus, r = HBus(), req()
        before = r.push
        handoff(bus).start_push(r)
        assert r.push is before and r.de_held == "" and not bus.asked
    asyncio.run(go())


@pytest.mark.parametrize(("code", "want"), [(ErrorCode.BUFFER_FULL, ErrorCode.BUFFER_FULL),
                                            (None, ErrorCode.KV_TRANSFER)])
def test_a_push_the_bus_fails_is_a_failed_push_done(code, want):
    async def go():
        req = request()
        bus = HBus(push=BusError("push", "no responders", code))
        handoff(bus).start_push(req)
        await req.push
        assert bus.asked[0].timeout == 2 * TIMEOUT  # no forward time expected
        assert req.pushed == PushDone(ok=False, error="no responders", code=want)
    asyncio.run(go())


def test_aborting_an_ended_push_tells_no_one():
    async def go():
        bus = HBus()
        h = handoff(bus)
        await h.abort_push(request())  # none
        req = request()
        h.start_push(req)
        await req.push
        await h.abort_push(req)
        assert not bus.sent
    asyncio.run(go())


def test_keep_alives_name_the_forwards_requests_every_quarter_deadline(monkeypatch):
    async def go():
        bus, slept = HBus(), []
        real = asyncio.sleep

        async def sleep(s):
            slept.append(s)
            await real(0)
        monkeypatch.setattr(asyncio, "sleep", sleep)
        h = handoff(bus)
        await h.keepalive([])  # no forward: returns at once
        assert not slept
        task = asyncio.ensure_future(h.keepalive([request(), PrefillRequest("r2", [1], Sampling(), "o", None)]))
        while len(bus.sent) < 2:
            await real(0)
        task.cancel()
        assert slept[:2] == [TIMEOUT / 4] * 2
        assert [(s, m) for s, m, _ in bus.sent[:2]] == [(at("TM_ALIVE", "pe"), ForwardAlive(["r1", "r2"]))] * 2
    asyncio.run(go())


# --- the hand-over: push, admission, failure ---------------------------------------------------------------------

def test_a_handed_over_request_is_admitted_with_its_pushed_slots_and_its_de_owns_them():
    async def go():
        bus, m = HBus(), pm()
        req = request(hit_tokens=2 * BS, de_held="de0", de_slots=[8192], de_hits=[0],
                      loads=PlanLoads(hits=2, stored=4))
        assert await outcomes(handoff(bus, pm=m), req) == [Free(req)]
        push, admit = bus.asked
        assert (push.subject, push.timeout) == (at("TM_PUSH", "pe"), TIMEOUT)
        assert push.msg == PushKV("r1", req.blocks, "de0", len(PROMPT), dst_slots=[8192], skip=[0])
        assert (admit.subject, admit.timeout, admit.abort) == (at("DE_ADMIT", "de0"), TIMEOUT, req.left())
        assert admit.msg == DecodeAdmit("r1", len(PROMPT), 7, req.sampling, "out", [0, 4096], pe_engine="pe",
                                        prompt=PROMPT, block_keys=KEYS, persisted_blocks=4, persist=True)
        assert req.de_held == "" and not bus.published(Release) and not bus.of(SaveKV)
        assert len(m.handoff.values) == 1 and m.handoff.values[0] >= 0 and not m.tail.values
    asyncio.run(go())


async def _boom(msg, abort):
    raise ValueError("boom")


@pytest.mark.parametrize(("answers", "code", "error"), [
    ({"push": PushDone(ok=False, error="buffer full", code=ErrorCode.BUFFER_FULL)}, ErrorCode.BUFFER_FULL,
     "buffer full"),
    ({"push": PushDone(ok=False, error="lost")}, ErrorCode.KV_TRANSFER, "lost"),
    ({"push": BusError("push", "timed out")}, ErrorCode.KV_TRANSFER, "timed out"),
    ({"admit": Ack(ok=False, error="no slots", code=ErrorCode.NOT_READY)}, ErrorCode.NOT_READY, "no slots"),
    ({"admit": _boom}, ErrorCode.INTERNAL, "ValueError: boom"),
])
def test_a_failed_hand_off_fails_the_request_frees_the_de_side_and_stores_the_prompt_here(answers, code, error,
                                                                                        caplog):
    async def go():
        bus, m = HBus(**answers), pm()
        req = request(de_held="de0")
        with caplog.at_level(logging.ERROR, logger="prefill_engine.handoff"):
            got = await outcomes(handoff(bus, pm=m), req)
        # a bug (not a bus failure) is logged with its traceback
        assert [r.getMessage() for r in caplog.records] == (["hand-off of r1 failed"] if code is ErrorCode.INTERNAL
                                                            else [])
        assert got == [Fail(req, code, f"KV hand-off to de0 failed: {error}", release=False), Free(req)]
        assert bus.published(Release) == [(at("TM_RELEASE", "de0"), Release("r1"))]
        (save,) = bus.of(SaveKV)
        assert (save.subject, save.timeout, save.ctx) == (at("TM_SAVE", "pe"), TIMEOUT, CTX)
        assert save.msg == SaveKV("r1", req.blocks[:6], KEYS, "nA", LAYOUT)
        assert len(m.handoff.values) == 1
    asyncio.run(go())


def test_a_request_cancelled_during_its_push_is_not_admitted_nor_answered():
    async def go():
        req = request()

        async def push(msg, abort):
            req.state = PeState.CANCELLING  # the client left meanwhile
            return PushDone()
        bus = HBus(push=push)
        assert await outcomes(handoff(bus), req) == [Free(req)]
        assert not bus.of(DecodeAdmit) and len(bus.of(SaveKV)) == 1
        assert bus.published(Release) == [(at("TM_RELEASE", "de0"), Release("r1"))]
    asyncio.run(go())


def test_a_plan_that_pushes_nothing_admits_with_no_slots_and_no_metric_needed():
    async def go():
        bus = HBus()
        req = request(plan=KvPlan(push=False, persist=False))
        assert await outcomes(handoff(bus), req) == [Free(req)]
        (admit,) = bus.asked
        assert (admit.msg.buf_slots, admit.msg.persist) == ([], False)
    asyncio.run(go())


@pytest.fixture
def clock(monkeypatch):
    """The hand-off's perf_counter: 10, 11, 12, ... one per reading."""
    ticks = iter(range(10, 100))
    monkeypatch.setattr(handoff_mod, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))


@pytest.mark.parametrize(("pushed", "computed_at", "metrics", "tail"), [
    (PushDone(slots=[1]), 1.0, True, [10.0]),  # read at 11: its last layer computed at 1
    (PushDone(slots=[1]), 0.0, True, []), (None, 1.0, True, []), (PushDone(slots=[1]), 1.0, False, None),
])
def test_the_layerwise_pushs_outcome_decides_the_admission_and_its_tail_is_timed(pushed, computed_at, metrics, tail,
                                                                                clock):
    async def go():
        bus, m = HBus(), pm() if metrics else None
        req = request(computed_at=computed_at)
        req.pushed = pushed
        req.push = asyncio.ensure_future(asyncio.sleep(0))
        got = await outcomes(handoff(bus, pm=m), req)
        if m is not None:
            assert m.tail.values == tail and m.handoff.values == [len(tail) + 1.0]  # from 10 to its last reading
        if pushed is None:  # the task ended without an outcome
            assert got[0] == Fail(req, ErrorCode.INTERNAL, "KV hand-off to de0 failed: the push task failed",
                                  release=False)
        else:
            assert got == [Free(req)] and bus.of(DecodeAdmit)[0].msg.buf_slots == [1]
        assert not bus.of(PushKV) and (at("TM_RELEASE", "pe"), Release("r1")) not in bus.published(Release)
    asyncio.run(go())


def test_the_hand_off_is_a_span_of_the_requests_trace(monkeypatch):
    spans = []

    class Tracer:
        def start_as_current_span(self, name, context=None, attributes=None):
            spans.append((name, context, attributes))
            return contextlib.nullcontext()
    monkeypatch.setattr(handoff_mod, "tracer", Tracer())
    asyncio.run(outcomes(handoff(HBus()), request()))
    assert spans == [("pd_handoff", CTX, {"req_id": "r1", "de_engine": "de0"})]


def test_a_client_leaving_during_the_layerwise_push_stops_it_and_waits_for_it():
    async def go():
        bus, gate = HBus(), asyncio.Event()
        req = request()

        async def push():
            await gate.wait()
            req.pushed = PushDone(ok=False, error="released", code=ErrorCode.CANCELLED)
        req.push = asyncio.ensure_future(push())
        task = asyncio.ensure_future(outcomes(handoff(bus), req))
        while not bus.sent:
            await asyncio.sleep(0)
        req.leave()
        while len(bus.sent) < 2:
            await asyncio.sleep(0)
        assert bus.published(Release) == [(at("TM_RELEASE", "pe"), Release("r1"))]
        assert not task.done()  # until the TM no longer reads the blocks
        gate.set()
        got = await task
        assert got[0].code is ErrorCode.CANCELLED and not bus.of(DecodeAdmit)
    asyncio.run(go())


def test_a_push_after_the_first_token_is_a_task_a_tm_restart_ends_at_once():
    async def go():
        asked, never = asyncio.Event(), asyncio.Event()

        async def stuck(msg, abort):  # the old TM took the push and died: no reply would ever come
            asked.set()
            await never.wait()
        bus, req = HBus(push=stuck), request()
        task = asyncio.ensure_future(outcomes(handoff(bus), req))
        await asked.wait()
        assert req.push is not None and not req.push.done() and not bus.of(PushKV)[0].msg.layerwise
        req.push.cancel()  # what the engine does for a request in transfer when its TM restarts
        got = await task
        assert isinstance(got[0], Fail) and got[0].code is ErrorCode.INTERNAL and got[-1] == Free(req)
        assert not bus.of(DecodeAdmit)
    asyncio.run(go())


# --- the prompt stored from here ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("prompt", "keys", "blocks", "hits", "loads", "saved"), [
    (PROMPT, KEYS, 7, 0, PlanLoads(), (0, 6)),
    (PROMPT, KEYS, 7, 2 * BS, PlanLoads(hits=2, stored=4), (4, 6)),  # the read found all: the plan's count
    (PROMPT, KEYS, 7, 1 * BS, PlanLoads(hits=2, stored=4), (1, 6)),  # a short read: the rest was computed
    (PROMPT, KEYS[:5], 7, 0, PlanLoads(), (0, 5)),
    (PROMPT, KEYS, 4, 0, PlanLoads(), (0, 4)),
    (PROMPT[:3 * BS + 1], KEYS, 7, 0, PlanLoads(), (0, 3)),
    (PROMPT, KEYS, 7, 5 * BS, PlanLoads(hits=5, stored=6), None),  # all stored already
    (PROMPT, KEYS, 7, 5 * BS, PlanLoads(hits=5, stored=9), None),
])
def test_the_prompts_blocks_the_store_lacks_are_saved(prompt, keys, blocks, hits, loads, saved):
    async def go():
        bus = HBus()
        req = request(prompt=prompt, keys=keys, blocks=list(range(10, 10 + blocks)), hit_tokens=hits, loads=loads)
        await handoff(bus).persist(req)
        if saved is None:
            assert not bus.asked
        else:
            (a,) = bus.asked
            lo, hi = saved
            assert (a.subject, a.timeout, a.ctx) == (at("TM_SAVE", "pe"), TIMEOUT, CTX)
            assert a.msg == SaveKV("r1", req.blocks[lo:hi], keys[lo:hi], "nA", LAYOUT)
    asyncio.run(go())


@pytest.mark.parametrize("req", [
    lambda: request(plan=KvPlan(persist=False)), lambda: request(computed=None),
    lambda: PrefillRequest("r1", PROMPT, Sampling(), "out", None, computed=len(PROMPT)),
])
def test_nothing_is_saved_without_work_a_plan_that_saves_or_a_computed_prompt(req):
    async def go():
        bus = HBus()
        await handoff(bus).persist(req())
        assert not bus.asked
    asyncio.run(go())


@pytest.mark.parametrize(("answer", "warned"), [
    (BusError("save", "timed out"), "timed out"), (SaveCopied(error="save line full"), "save line full"),
    (SaveCopied(copied=6), None),
])
def test_a_save_that_fails_is_only_logged(answer, warned, caplog):
    async def go():
        with caplog.at_level(logging.WARNING, logger="prefill_engine.handoff"):
            await handoff(HBus(save=answer)).persist(request())
    asyncio.run(go())
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == (1 if warned else 0) and all("r1" in m and warned in m for m in msgs)
