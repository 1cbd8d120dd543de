"""The dispatcher's ledger: load figures kept up to date event by event equal a from-scratch recount."""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from shared.sched.dispatch import Dispatcher, EngineLoad, Job
from shared.sched.ledger import Ledger, LedgerError
from shared.sched.policy import PeThresholds

pytestmark = pytest.mark.unit

PES = [f"pe{i}" for i in range(4)]
DES = [f"de{i}" for i in range(3)]


@dataclass
class Rec:
    """What the scheduler knows of one request, as its InFlight record does."""

    prompt: int
    gen: int
    pe: str = ""
    de: str = ""
    first_token: bool = False


def recount(recs: dict[str, Rec], pe_of: dict[str, str], role: str, engine: str) -> tuple[int, int]:
    """The scheduler's former `_loads`: every request in flight scanned for every engine."""
    if role == "prefill":  # prefill not over, plus PE chosen and DE not yet
        mine = [r for r in recs.values() if r.pe == engine and not r.first_token]
        mine += [recs[q] for q, pe in pe_of.items() if pe == engine and q in recs]
        return sum(r.prompt for r in mine), len(mine)
    mine = [r for r in recs.values() if r.de == engine]
    return sum(r.prompt + r.gen for r in mine), len(mine)


def loads(d: Dispatcher, names: list[str], role: str, cap: int = 0) -> list[EngineLoad]:
    get = d.ledger.pe_load if role == "prefill" else d.ledger.de_load
    return [EngineLoad(n, *get(n), capacity_tokens=cap, group=n, node=n) for n in names]


def test_incremental_loads_equal_a_recount_after_random_events():
    rnd = random.Random(7)
    d = Dispatcher(PeThresholds(alpha=1 << 30, beta=3000))
    recs: dict[str, Rec] = {}
    n = 0
    for step in range(3000):
        roll = rnd.random()
        live = list(recs)
        if roll < 0.3:  # a request arrives
            rid, n = f"r{n}", n + 1
            recs[rid] = Rec(rnd.randint(1, 800), rnd.randint(0, 200))
            d.enqueue(Job(rid, recs[rid].prompt, recs[rid].gen))
        elif roll < 0.5:  # a dispatch round
            for a in d.assign(loads(d, PES, "prefill"), loads(d, DES, "decode", cap=20_000)):
                recs[a.req_id].pe, recs[a.req_id].de = a.pe, a.de
        elif roll < 0.7 and live:  # a first token: prefill over
            rid = rnd.choice(live)
            if recs[rid].de:
                recs[rid].first_token = True
                d.prefill_done(rid)
        elif roll < 0.85 and live:  # finished, cancelled or timed out: forgotten
            rid = rnd.choice(live)
            del recs[rid]
            d.remove(rid)
        elif live:  # resumed: off its engines, queued again with what is left
            rid = rnd.choice(live)
            old = recs[rid]
            recs[rid] = Rec(old.prompt + old.gen // 2, old.gen - old.gen // 2)
            d.remove(rid)
            d.enqueue(Job(rid, recs[rid].prompt, recs[rid].gen))
        d.ledger.check_integrity()
        for role, names in (("prefill", PES), ("decode", DES)):
            for e in names:
                get = d.ledger.pe_load if role == "prefill" else d.ledger.de_load
                assert get(e) == recount(recs, d.pe_of, role, e), (step, role, e)
        assert d.ledger.placed == sum(1 for r in recs.values() if r.de)
        assert d.waiting() == sum(1 for r in recs.values() if not r.de)
    assert n > 500 and any(r.de for r in recs.values())  # the walk placed requests, not only queued them


def test_prefill_engine_carries_a_request_from_its_pick_until_its_first_token():
    led = Ledger()
    led.charge_pe("r1", "p0", 100)
    assert led.pe_load("p0") == (100, 1)
    led.charge_de("r1", "d0", 110)
    led.prefill_done("r1")
    assert led.pe_load("p0") == (0, 0) and led.de_load("d0") == (110, 1)
    led.release("r1")
    assert led.de_load("d0") == (0, 0) and not led.charges and led.placed == 0


def test_check_integrity_names_the_engine_whose_counter_drifted():
    led = Ledger()
    led.charge_de("r1", "d0", 50)
    led._de["d0"][0] += 1  # a missed update
    with pytest.raises(LedgerError) as err:
        led.check_integrity()
    assert err.value.engine == "d0" and err.value.counted == (51, 1) and err.value.summed == (50, 1)
