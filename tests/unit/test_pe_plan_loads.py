"""The prefill engine executes a KV plan without knowing the load mode: the plan's ranges in its
fetch's terms (`FetchKV`), clamped to its prompt; a plan it cannot execute is answered as BAD_PLAN."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from services.prefill_engine.config import PrefillEngineConfig
from services.prefill_engine.handoff import Handoff
from services.prefill_engine.link import PeLink
from services.prefill_engine.plan_read import PlanLoads, plan_loads
from services.prefill_engine.record import PrefillRequest
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.plan import KvPlan, KvRange, PlanError, Source
from shared.messages.stream import TokenEvent
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import FetchKV, PushDone, PushKV
from shared.messages.work import Ack, DecodeAdmit, PrefillWork, Sampling, StagedSlots
from shared.sched.plan import InBuffer, PlanEnds, PlanInput, dualpath_split, oracle
from tests.unit.pe_util import intake, run
from tests.unit.plan_util import present_plan
from tests.unit.test_engine_failures import BS, LAYOUT, Bus, Engine

pytestmark = pytest.mark.unit

S, B, P, C = Source.STORE, Source.BUFFER, Source.PRESENT, Source.COMPUTE
ENDS = PlanEnds("pe", "nA", "de0", "nB")
KEYS = [bytes([i]) * 16 for i in range(6)]
PROMPT = list(range(6 * BS + 3))  # six full blocks and three tokens


def work(plan: KvPlan, prompt: list[int] = PROMPT, keys: list[bytes] = KEYS) -> PrefillWork:
    return PrefillWork("r1", prompt, Sampling(), "de0", "out", block_keys=keys, plan=plan)


def test_a_split_plan_with_buffered_blocks_is_its_fetchs_terms():
    slots = StagedSlots("buf", "tab", 0, 1, [0, 4096])
    plan = dualpath_split(PlanInput(7, 5, 6, ENDS, 1, InBuffer(2, "de0", "pf-1", slots)))
    assert plan_loads(work(plan), "pe", BS) == PlanLoads(
        hits=5, staged=2, staged_engine="de0", staged_owner="pf-1", staged_slots=slots, pe_blocks=3, node="nA",
        de_node="nB", stored=6)


def test_loads_are_clamped_to_the_prompt_and_its_keys():
    plan = KvPlan([KvRange(0, 3, S, node="nA", engine="pe"), KvRange(3, 4, C)], stored=3)
    assert plan_loads(work(plan, PROMPT[:3 * BS]), "pe", BS).hits == 2  # the last token is always computed
    assert plan_loads(work(plan, keys=KEYS[:1]), "pe", BS).hits == 1


def test_present_blocks_load_nothing():
    got = plan_loads(work(oracle(PlanInput(7, 4, 4, ENDS))), "pe", BS)
    assert (got.hits, got.present, got.pe_blocks, got.staged, got.stored) == (4, True, 0, 0, 4)


@pytest.mark.parametrize(("ranges", "why"), [
    ([KvRange(0, 2, S, engine="pe-other")], "neither this engine nor its DE"),
    ([KvRange(0, 2, S, engine="de0"), KvRange(2, 3, S, engine="pe")], "out of order"),  # DE path before PE path
    ([KvRange(0, 2, S, engine="pe"), KvRange(2, 3, B, engine="de0", owner="x")], "out of order"),
    ([KvRange(0, 2, P), KvRange(2, 3, S, engine="pe")], "out of order"),  # present beside loaded
    ([KvRange(0, 2, S, node="nA", engine="pe"), KvRange(2, 3, S, node="nC", engine="pe")], "two places"),
    ([KvRange(0, 2, C), KvRange(2, 3, P)], "after a computed one"),
])
def test_a_plan_the_engine_cannot_execute_raises(ranges, why):
    with pytest.raises(PlanError, match=why):
        plan_loads(work(KvPlan(ranges)), "pe", BS)


def test_the_engine_answers_a_bad_plan_with_its_code_and_holds_nothing():
    async def go(tg):
        bus = Bus()
        eng = Engine(bus, tg)
        await eng.svc._on_work(work(KvPlan([KvRange(0, 2, S, engine="elsewhere")])), SimpleNamespace(ctx=None))
        (ev,) = [m for _, m in bus.sent if isinstance(m, TokenEvent)]
        assert (ev.req_id, ev.finish, ev.code, ev.retryable) == ("r1", FinishReason.ERROR, ErrorCode.BAD_PLAN, False)
        assert "elsewhere" in ev.error and not eng.held and not eng.queued
    run(go)


def test_the_fetch_carries_the_plans_paths():
    async def go(tg):
        bus = Bus()
        eng = Engine(bus, tg)
        plan = dualpath_split(PlanInput(7, 5, 6, ENDS, 1, InBuffer(2, "pe", "pf-1")))
        await intake(eng.svc, work(plan))
        while not (fetches := [m for _, m in bus.sent if isinstance(m, FetchKV)]):
            await asyncio.sleep(0)
        (f,) = fetches
        assert (len(f.block_keys), f.pe_blocks, f.staged_blocks, f.staged_engine, f.staged_owner) == (5, 3, 2, "pe",
                                                                                                   "pf-1")
        assert (f.node, f.de_node, f.de_engine) == ("nA", "nB", "de0")
    run(go)



@pytest.mark.parametrize(("plan", "pushed"), [(KvPlan(), True), (present_plan(2), False)])
def test_the_plans_flags_decide_the_push_and_what_the_de_is_told(plan, pushed):
    sent = []

    class HBus:
        async def request(self, subject, msg, timeout=5.0, ctx=None, abort=None):
            sent.append(msg)
            return PushDone(slots=[4096, 8192, 0]) if isinstance(msg, PushKV) else Ack()

    async def go():
        h = Handoff(PeLink(HBus(), Subjects("t"), "pe", lambda coro, name=None: asyncio.ensure_future(coro)),
                    PrefillEngineConfig(handoff_timeout_s=5.0, node="nA"), LAYOUT, ())
        w = work(plan, PROMPT[:2 * BS + 3], KEYS[:2])
        req = PrefillRequest("r1", w.prompt, w.sampling, "out", None, work=w, blocks=[5, 6, 7], computed=len(w.prompt))
        await h._push_and_admit(req, 7)
    asyncio.run(go())
    (admit,) = [m for m in sent if isinstance(m, DecodeAdmit)]
    assert any(isinstance(m, PushKV) for m in sent) is pushed
    assert (admit.buf_slots, admit.persist) == (([4096, 8192, 0], True) if pushed else ([], False))
