"""The scheduler's side of agent sessions, on a fake bus: a hinted turn is retained and its next
turn prefetched; the next turn claims what was staged; a turn back before its prefetch started
cancels it; a session that comes back on another prefix gives its staged blocks back; release
ends both the retention and the staging."""
from __future__ import annotations

import asyncio

import pytest

from services.scheduler.config import SchedulerConfig
from services.scheduler.inflight import InFlight
from services.scheduler.prefetcher import Prefetcher
from services.scheduler.view import MeshView
from shared.engine.store_layout import prompt_keys
from shared.messages.front import Hint
from shared.messages.registry import EngineAnnounce, KVRegion, StorageGatewayAnnounce, TrafficManagerAnnounce
from shared.messages.storage_gateway import HitReply, Retain, RetainLevel, StoreLayout
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import Prefetch, Prefetched, Release
from shared.messages.work import Sampling
from shared.metrics import Metrics
from shared.sched.reads import PendingReads

pytestmark = pytest.mark.unit
LAYOUT = StoreLayout(b"f" * 16, "m", 2, 1, 8, "float32", 64)
BB = 4096


class Bus:
    def __init__(self):
        self.sent: list = []

    async def publish(self, subject, msg, ctx=None):
        self.sent.append((subject, msg))

    async def request(self, subject, msg, timeout, abort=None):
        self.sent.append((subject, msg))
        return Prefetched(blocks=len(msg.block_keys))


def _prefetcher(**cfg):
    view = MeshView(timeout_s=1e9)
    for engine, node, role in (("p0-e0", "p0", "prefill"), ("d1-e0", "d1", "decode")):
        view.update(EngineAnnounce(instance=engine, node=node, engine=engine, role=role, store=LAYOUT,
                                   kv=KVRegion("kv", 64, 64, 2, BB, BB // 2)), 0.0)
        view.update(TrafficManagerAnnounce(instance=f"tm-{engine}", node=node, engine=engine, ready=True,
                                           prefetch_room_bytes=100 * BB), 0.0)
        view.update(StorageGatewayAnnounce(instance=f"sg-{node}", node=node), 0.0)
    bus = Bus()

    async def hits(q):
        return HitReply(blocks=len(q.block_keys))

    pf = Prefetcher(bus, Subjects("t"), view, PendingReads(), SchedulerConfig(**cfg), lambda coro, name=None:
                    asyncio.get_running_loop().create_task(coro), hits, Metrics("scheduler"))
    return pf, bus


def _turn(tokens: list[int], hint: Hint | None) -> InFlight:
    rec = InFlight("r", tokens, Sampling(max_tokens=4), hint=hint)
    rec.block_keys = prompt_keys(LAYOUT, tokens)
    return rec


def _done(tokens: list[int], hint: Hint) -> InFlight:
    rec = _turn(tokens[:-4], hint)
    rec.tokens = tokens[-4:]
    return rec


async def _until(pred):
    for _ in range(3000):  # a poll, not a deadline: generous for a loaded machine
        if pred():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met")


def test_a_hinted_turn_is_retained_staged_and_claimed_by_the_next_turn():
    async def go():
        pf, bus = _prefetcher()
        first = list(range(300))  # 4 full blocks of prompt + generated
        pf.done(_done(first, Hint(session="s", tool_s=0.05)), "ok")
        await _until(lambda: pf.index.by_owner)
        retain = next(m for _, m in bus.sent if isinstance(m, Retain))
        assert (retain.level, retain.ttl_s, len(retain.block_keys)) == (RetainLevel.RETAINED, 120.0, 4)
        sent = next(m for _, m in bus.sent if isinstance(m, Prefetch))
        assert sent.block_keys == prompt_keys(LAYOUT, first[:-1]) and sent.node == "p0"  # idle queues: prefill side
        nxt = _turn(first + list(range(1000, 1100)), Hint(session="s"))
        pf.arrive(nxt)
        assert nxt.staged is not None and nxt.staged.keys == sent.block_keys and nxt.staged.claimed_by == "r"
        pf.done(nxt, "ok")  # its fetch released the slots; the scheduler makes sure
        await _until(lambda: any(isinstance(m, Release) and m.req_id == sent.owner for _, m in bus.sent))
        assert not pf.index.by_owner
        pf.index.check_integrity()
    asyncio.run(go())


def test_a_turn_back_before_its_prefetch_started_cancels_it():
    async def go():
        pf, bus = _prefetcher()
        first = list(range(300))
        pf.done(_done(first, Hint(session="s", tool_s=30.0)), "ok")  # unknown rate: starts 2 s before its return
        assert pf.planned
        pf.arrive(_turn(first + [7] * 40, None))
        assert not pf.planned  # cancelled on arrival, not left to run
        await asyncio.sleep(0)  # the cancelled task's turn: it sends nothing
        assert not any(isinstance(m, Prefetch) for _, m in bus.sent)
    asyncio.run(go())


def test_a_session_back_on_another_prefix_or_released_gives_its_staging_back():
    async def go():
        pf, bus = _prefetcher()
        pf.done(_done(list(range(300)), Hint(session="s", tool_s=0.05)), "ok")
        await _until(lambda: pf.index.by_owner)
        owner = next(iter(pf.index.by_owner))
        pf.arrive(_turn(list(range(5000, 5300)), Hint(session="s")))  # not the staged prefix
        await _until(lambda: any(isinstance(m, Release) and m.req_id == owner for _, m in bus.sent))
        assert not pf.index.by_owner
        pf.done(_done(list(range(300)), Hint(session="s", tool_s=0.05)), "ok")
        await _until(lambda: pf.index.by_owner)
        pf.done(_turn(list(range(9000, 9010)), Hint(session="s", release=True)), "ok")
        await _until(lambda: any(isinstance(m, Retain) and m.release and m.session == "s" for _, m in bus.sent))
        assert not pf.index.by_owner
    asyncio.run(go())


def test_the_decode_side_stages_when_its_storage_nic_is_idler_and_oracle_turns_are_left_alone():
    async def go():
        pf, bus = _prefetcher()
        pf.reads.pending["p0"] = 10_000  # tokens queued on the prefill node's storage NIC
        pf.done(_done(list(range(300)), Hint(session="s", tool_s=0.05)), "ok")
        await _until(lambda: pf.index.by_owner)
        assert next(m for _, m in bus.sent if isinstance(m, Prefetch)).node == "d1"
        from shared.messages.codes import LoadMode
        rec = _done(list(range(400, 700)), Hint(session="o", tool_s=0.05))
        rec.mode = LoadMode.ORACLE
        n = len(bus.sent)
        pf.done(rec, "ok")
        assert not pf.planned and len(bus.sent) == n  # the decision is taken in done(): nothing planned or sent
    asyncio.run(go())


def test_the_prefill_side_stages_when_its_read_fits_the_tool_call_and_keeps_it_when_the_read_starts():
    async def go():
        for prefer, node in ((True, "p0"), (False, "d1")):
            pf, bus = _prefetcher(prefetch_prefer_pe=prefer)
            for n in ("p0", "d1"):  # a known storage-NIC rate: 10 MB/s
                pf.view.update(StorageGatewayAnnounce(instance=f"sg-{n}", node=n, read_bytes_per_s=1e7), 0.0)
            pf.reads.pending["p0"] = 64  # one block's tokens queued on the prefill node: d1 is the idler NIC
            pf.done(_done(list(range(300)), Hint(session="s", tool_s=1.0)), "ok")  # ~5 ms of read, 1 s of call
            await _until(lambda: pf.index.by_owner)
            assert next(m for _, m in bus.sent if isinstance(m, Prefetch)).node == node, prefer
        # asked again as the read starts, with the session due in less than the prefill side's lead:
        # planned on the prefill side, it stays there; planned afresh, the idler NIC's side
        import time
        from shared.sched.policy.read_path import ReadPath
        pf, _ = _prefetcher()
        pf.reads.pending["p0"] = 64
        soon = time.monotonic() + 0.5  # the unknown rate's fixed lead (2 s) does not fit
        assert pf._plan(4, soon, pf.cfg.mode, keep=ReadPath.PE).node == "p0"
        assert pf._plan(4, soon, pf.cfg.mode).node == "d1"
    asyncio.run(go())


def test_a_basic_mode_session_stages_on_the_prefill_side_even_when_the_decode_nic_is_idler():
    async def go():
        from shared.messages.codes import LoadMode
        pf, bus = _prefetcher()
        pf.reads.pending["p0"] = 10_000  # as above: dualpath would stage on d1
        rec = _done(list(range(300)), Hint(session="b", tool_s=0.05))
        rec.mode = LoadMode.BASIC  # basic reads hits on the PE path only: its prefetch follows the same rule
        pf.done(rec, "ok")
        await _until(lambda: pf.index.by_owner)
        assert next(m for _, m in bus.sent if isinstance(m, Prefetch)).node == "p0"
    asyncio.run(go())


def test_a_whole_staged_turn_answers_the_next_turns_hit_lookup_without_a_gateway():
    from services.scheduler.hits import lookup_hits
    from services.scheduler.oracle import OracleIndex

    async def go():
        pf, bus = _prefetcher()
        first = list(range(300))  # 4 full blocks stored, all staged
        pf.done(_done(first, Hint(session="s", tool_s=0.05)), "ok")
        await _until(lambda: pf.index.by_owner)
        nxt = _turn(first + list(range(1000, 1100)), Hint(session="s"))
        asked = []

        async def ask(q):
            asked.append(q)
            return HitReply(blocks=len(q.block_keys))

        await lookup_hits(nxt, LAYOUT, OracleIndex(), ask, pf.stored_prefix)
        assert nxt.hit_blocks == 4 and not asked  # the staged turn is the stored prefix: no round trip
        other = _turn(list(range(2000, 2300)), None)  # nothing staged for it: the gateway is asked
        await lookup_hits(other, LAYOUT, OracleIndex(), ask, pf.stored_prefix)
        assert len(asked) == 1 and other.hit_blocks == len(other.block_keys)
        s = next(iter(pf.index.by_owner.values()))
        s.whole = False  # staged short of its turn (the rest may be stored): asked as before
        again = _turn(first + list(range(1000, 1100)), Hint(session="s"))
        await lookup_hits(again, LAYOUT, OracleIndex(), ask, pf.stored_prefix)
        assert len(asked) == 2
    asyncio.run(go())


def test_the_sweep_sleeps_while_nothing_is_staged_and_releases_what_expires(monkeypatch):
    """No polling of an empty index: with SWEEP_S at 0 a polling sweep would run at every loop turn."""
    monkeypatch.setattr("services.scheduler.prefetcher.SWEEP_S", 0.0)

    async def go():
        pf, bus = _prefetcher()
        looked = []
        expired = pf.index.expired
        pf.index.expired = lambda now: (looked.append(now), expired(now))[1]
        task = asyncio.ensure_future(pf.sweep())
        for _ in range(50):
            await asyncio.sleep(0)
        idle = len(looked)
        pf.done(_done(list(range(300)), Hint(session="s", tool_s=0.0, ttl_s=0.0)), "ok")  # staged, due at once
        await _until(lambda: any(isinstance(m, Release) for _, m in bus.sent))  # the sweep woke and released it
        task.cancel()
        return idle, looked
    idle, looked = asyncio.run(go())
    assert idle == 0 and looked
