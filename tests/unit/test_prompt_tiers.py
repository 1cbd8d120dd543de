"""Prompt-token tiers, counted where they are known and carried to the client: the prefill engine
splits each prompt by its read's report (buffer, PE path, DE path) or the oracle's hits (engine),
counts it per engine and tier, and sends it with the first token; the scheduler cuts a resumed
attempt's split to the request's prompt and shows it in `usage`. Every split sums to the prompt."""
from __future__ import annotations

import asyncio

import msgspec
import pytest

from services.prefill_engine.config import PrefillEngineConfig
from services.prefill_engine.handoff import Handoff
from services.prefill_engine.link import PeLink
from services.prefill_engine.metrics import PrefillMetrics
from services.prefill_engine.outcomes import Free
from services.prefill_engine.plan_read import plan_loads
from services.prefill_engine.record import PrefillRequest
from services.scheduler.inflight import InFlight
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.protocol import usage
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.front import Done, FrontMsg
from shared.messages.stream import PromptTiers, TokenEvent
from shared.messages.traffic_manager import FetchFailed, ReadFinished
from shared.messages.work import PrefillWork, Sampling
from shared.metrics import Metrics
from shared.tiers import NAMES, as_dict, clip, total
from tests.unit.plan_util import present_plan
from tests.unit.pe_util import run
from tests.unit.test_engine_failures import BS, LAYOUT, Bus, Engine

pytestmark = pytest.mark.unit


# --- the split of one attempt's prompt, cut to a length --------------------------------------------

def test_the_tier_names_are_the_five_documented_ones():
    assert NAMES == ("computed", "engine", "buffer", "storage_pe", "storage_de")
    assert as_dict(PromptTiers(storage_de=3)) == {"computed": 0, "engine": 0, "buffer": 0, "storage_pe": 0,
                                                  "storage_de": 3}


@pytest.mark.parametrize("n, want", [
    (100, PromptTiers(computed=10, buffer=30, storage_pe=30, storage_de=30)),  # the whole attempt
    (70, PromptTiers(buffer=30, storage_pe=30, storage_de=10)),  # a resumed attempt: the prompt ends in the DE part
    (20, PromptTiers(buffer=20)),
    (120, PromptTiers(computed=30, buffer=30, storage_pe=30, storage_de=30)),  # past the split: computed
])
def test_clip_keeps_the_first_tokens_in_prompt_order(n, want):
    got = clip(PromptTiers(computed=10, buffer=30, storage_pe=30, storage_de=30), n)
    assert got == want and total(got) == n


def test_clip_puts_the_oracles_engine_hits_first():
    assert clip(PromptTiers(computed=50, engine=64), 70) == PromptTiers(computed=6, engine=64)


# --- the prefill engine: the split from its read's report -------------------------------------------

def _read(report) -> PrefillRequest:
    """A 3-hit request (3 * BS + 5 tokens) whose fetch reports `report`; returns it once read."""
    out = []

    async def go(tg):
        eng = Engine(Bus(), tg)
        req = await eng.submit(hits=3)
        await eng.progress(report)
        out.append(req)
    run(go)
    return out[0]


@pytest.mark.parametrize("report, want", [
    (ReadFinished("r1", 3), PromptTiers(computed=5, storage_pe=3 * BS)),
    (ReadFinished("r1", 3, staged=1, de_read=1), PromptTiers(computed=5, buffer=BS, storage_pe=BS, storage_de=BS)),
    (ReadFinished("r1", 3, de_read=3), PromptTiers(computed=5, storage_de=3 * BS)),
    (ReadFinished("r1", 3, staged=3), PromptTiers(computed=5, buffer=3 * BS)),
    (ReadFinished("r1", 2, staged=1, de_read=1), PromptTiers(computed=BS + 5, buffer=BS, storage_de=BS)),  # short
    (ReadFinished("r1", 0), PromptTiers(computed=3 * BS + 5)),  # a miss after all
    (FetchFailed("r1", ErrorCode.KV_TRANSFER, "gone"), PromptTiers(computed=3 * BS + 5)),  # before the read
])
def test_the_engine_splits_its_prompt_by_the_reads_report(report, want):
    req = _read(report)
    got = req.prompt_tiers(BS)
    assert got == want and total(got) == len(req.prompt)
    assert len(req.prompt) - got.computed == req.hit_tokens  # the split's hits are what cached_tokens says


def test_the_oracles_hits_are_taken_as_already_in_engine_memory():
    prompt = list(range(3 * BS + 5))
    work = PrefillWork("r1", prompt, Sampling(), "de", "out", block_keys=[bytes(16)] * 3, plan=present_plan(3))
    req = PrefillRequest("r1", prompt, work.sampling, "out", None, work=work, hit_tokens=3 * BS,
                         loads=plan_loads(work, "pe0", BS))
    assert req.prompt_tiers(BS) == PromptTiers(computed=5, engine=3 * BS)


def test_every_tier_is_exported_per_engine_from_the_start_and_counts_prefilled_prompts():
    m = Metrics("prefill_engine")
    pm = PrefillMetrics(m, "p0-e0")
    name = "dualpath_prefill_engine_prompt_tier_tokens_total"

    def value(tier):
        return m.registry.get_sample_value(name, {"engine": "p0-e0", "tier": tier})
    assert [value(t) for t in NAMES] == [0.0] * 5
    pm.prefilled(PromptTiers(computed=5, buffer=BS, storage_de=2 * BS))
    pm.prefilled(PromptTiers(computed=1, engine=BS))
    assert [value(t) for t in NAMES] == [6.0, BS, BS, 0.0, 2 * BS]
    assert m.registry.get_sample_value("dualpath_prefill_engine_requests_total") == 2


def test_the_first_token_carries_the_split():
    bus, prompt = Bus(), list(range(2 * BS + 3))
    work = PrefillWork("r1", prompt, Sampling(max_tokens=1), "de", "out", block_keys=[bytes(16)] * 2,
                       plan=present_plan(2))
    req = PrefillRequest("r1", prompt, work.sampling, "out", None, work=work, hit_tokens=2 * BS,
                         loads=plan_loads(work, "pe0", BS))
    req.tiers = req.prompt_tiers(BS)

    async def go():
        h = Handoff(PeLink(bus, None, "pe0", lambda coro, name=None: asyncio.ensure_future(coro)),
                    PrefillEngineConfig(handoff_timeout_s=600.0, node="n0"), LAYOUT, ())
        said = [o async for o in h.run(req, 7, None)]
        assert said == [Free(req)]  # finished here: nothing to fail
    asyncio.run(go())
    ev = next(m for _, m in bus.sent if isinstance(m, TokenEvent))
    assert (ev.cached_tokens, ev.tiers) == (2 * BS, PromptTiers(computed=3, engine=2 * BS))
    assert ev.finish == FinishReason.LENGTH


# --- the scheduler: the request's split, in its usage and its counter --------------------------------

def test_a_resumed_attempts_split_is_cut_to_the_requests_prompt():
    rec = InFlight("r1", list(range(100)), Sampling(max_tokens=40))
    rec.accept(TokenEvent("r1", [1], 0, cached_tokens=64, tiers=PromptTiers(computed=36, storage_pe=64)))
    assert rec.tiers == PromptTiers(computed=36, storage_pe=64) and rec.cached_tokens == 64
    rec.restart()  # a new attempt: the prompt plus the token already streamed, 101 tokens, 96 stored
    rec.accept(TokenEvent("r1", [2], 1, cached_tokens=96, tiers=PromptTiers(computed=5, buffer=32, storage_de=64)))
    assert rec.tiers == PromptTiers(computed=4, buffer=32, storage_de=64)
    assert rec.cached_tokens == 96 and total(rec.tiers) == 100  # never more than the prompt


def test_usage_shows_the_split_beside_cached_tokens_and_only_when_an_engine_said():
    tiers = PromptTiers(computed=4, buffer=32, storage_de=64)
    details = usage(100, 5, 96, tiers)["prompt_tokens_details"]
    assert details == {"cached_tokens": 96, "dualpath_tiers": {"computed": 4, "engine": 0, "buffer": 32,
                                                               "storage_pe": 0, "storage_de": 64}}
    assert usage(100, 5, 0)["prompt_tokens_details"] == {"cached_tokens": 0}


def test_a_workers_done_carries_the_split_to_the_cores_counter():
    tiers = PromptTiers(computed=4, storage_pe=32, storage_de=64)
    wire = msgspec.msgpack.encode(Done("r1", "ok", [1, 2], 96, tiers=tiers))
    done = msgspec.msgpack.Decoder(FrontMsg).decode(wire)
    assert done.tiers == tiers
    m = Metrics("scheduler")
    sm = SchedulerMetrics.register(m)
    rec = InFlight("r1", [], Sampling(), remote_prompt=100)
    rec.tiers = done.tiers
    sm.finished(rec, "ok")
    got = {t: m.registry.get_sample_value("dualpath_scheduler_prompt_tier_tokens_total", {"tier": t}) for t in NAMES}
    assert got == {"computed": 4, "engine": 0, "buffer": 0, "storage_pe": 32, "storage_de": 64}
