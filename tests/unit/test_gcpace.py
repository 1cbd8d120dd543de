"""Collections at a steady pace (shared/gcpace.py): a steady state's young generation stays small."""
import asyncio
import collections
import gc

import pytest

from shared import gcpace

pytestmark = pytest.mark.unit


@pytest.fixture
def collector():
    was, thresholds = gc.isenabled(), gc.get_threshold()
    gc.enable()
    gc.collect()
    yield
    gc.enable() if was else gc.disable()
    gc.set_threshold(*thresholds)


def _churn(live: collections.deque, n: int) -> None:
    for _ in range(n):  # a steady state: one request's record made for every old one freed
        live.append([object()])
        live.popleft()


def test_a_steady_state_churn_is_never_collected_automatically_and_a_paced_pass_keeps_it_young(collector):
    live = collections.deque([object()] for _ in range(5000))
    gc.collect()  # the records in flight are old now
    _churn(live, 4000)
    assert len(gc.get_objects(generation=0)) >= 3000  # the count never grew: no automatic pass came
    assert gcpace.collect_due() == 0
    assert len(gc.get_objects(generation=0)) < 100  # what one pass scanned is what it left old
    for _ in range(20):  # paced: each pass scans only what the last interval made
        _churn(live, 200)
        assert len(gc.get_objects(generation=0)) < 600
        gcpace.collect_due()


def test_a_paced_collection_goes_on_to_the_older_generations_on_the_collectors_thresholds(collector):
    _, t1, t2 = gc.get_threshold()
    gens = [gcpace.collect_due() for _ in range((t1 + 2) * (t2 + 2))]  # enough young passes for an old one
    assert 1 in gens and 2 in gens and gens.count(0) > gens.count(1) > gens.count(2)
    gc.disable()
    assert gcpace.collect_due() == -1  # the collector is off: nothing runs


def test_pace_collects_while_the_service_runs(collector):
    async def run() -> int:
        before = gc.get_stats()[0]["collections"]
        task = asyncio.ensure_future(gcpace.pace(0.001))
        for _ in range(100_000):  # (a pacer that never collects fails here, never hangs)
            if gc.get_stats()[0]["collections"] >= before + 3:
                break
            await asyncio.sleep(0)
        task.cancel()
        return gc.get_stats()[0]["collections"] - before

    assert asyncio.run(run()) >= 3
    assert gc.get_threshold()[2] >= gcpace.OLD_PASSES  # full passes seldom: a steady state leaves no cycles
