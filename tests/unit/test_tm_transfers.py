"""The traffic manager's transfers by state (services/traffic_manager/transfers.py): each kind's legal
moves, every live state with a way out on failure, release and deadline, how an ending is told apart,
the gauge, and the real fetch, push, save and prefetch paths (dp_mesh.py) ending every transfer they began."""
from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

import pytest

from services.traffic_manager.prefetch import PrefetchPath
from services.traffic_manager.progress import Stalled
from services.traffic_manager.read_queues import ReadQueues
from services.traffic_manager.transfers import ENDS, LEGAL, PATHS, TERMINAL, TransferKind, Transfers, deadline
from services.traffic_manager.transfers import TransferState as T
from services.traffic_manager.waitline import SlotWaitExpired
from shared.bus import BusError
from shared.metrics import Metrics
from shared.transport.errors import PeerGone, TransferTimeout
from shared.messages.registry import KVRegion
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import PushKV
from tests.unit.dp_engines import Decode, Prefill, work
from tests.unit.dp_mesh import DE, Mesh, Tasks
from tests.unit.test_tm_prefetch import BLOCK, Gateway, _keys, _stage
from tests.unit.tm_util import Reply, buffer_pool

pytestmark = pytest.mark.unit
GUARD_S = 60.0


@pytest.fixture
def parts():
    """A prefetch path's parts over a fresh buffer (test_tm_prefetch.py's), with their transfers."""
    region, pool, m = buffer_pool("t-xf", 16 * BLOCK, KVRegion("kv", 8, 16, 2, BLOCK, BLOCK // 2))
    yield SimpleNamespace(cfg=SimpleNamespace(transfer_timeout_s=5.0), bus=Gateway(), subjects=Subjects("t"),
                          metrics=m, pool=pool, queues=ReadQueues(5.0),
                          m_bytes=m.counter("bytes_total", "b", ("kind",)), xfers=Transfers())
    region.close()
    region.unlink()


@pytest.mark.parametrize("kind", list(TransferKind))
def test_every_live_state_of_every_kind_has_a_way_out_and_done_is_reachable(kind):
    legal = LEGAL[kind]
    live = [s for s in legal if s not in TERMINAL]
    assert live and all(ENDS <= legal[s] for s in live)
    assert all(not legal[s] for s in TERMINAL)
    seen, todo = set(), [next(iter(PATHS[kind]))]
    while todo:
        s = todo.pop()
        seen.add(s)
        todo += [n for n in legal[s] if n not in seen]
    assert T.DONE in seen and set(live) <= seen


def _nats_timeout() -> BusError:
    try:
        try:
            raise TimeoutError("nats")
        except TimeoutError:
            raise BusError("sg.n.read", "no reply within 5s") from None
    except BusError as exc:
        return exc


@pytest.mark.parametrize("exc,state", [
    (None, T.DONE), (TransferTimeout("p", 1.0, 10), T.EXPIRED), (Stalled("layer 2 read"), T.EXPIRED),
    (SlotWaitExpired(4, 1), T.EXPIRED), (_nats_timeout(), T.EXPIRED), (PeerGone("p"), T.FAILED),
    (BusError("x", "refused"), T.FAILED), (RuntimeError("bug"), T.FAILED), (T.RELEASED, T.RELEASED)])
def test_an_ending_is_told_apart_by_what_ended_it(exc, state):
    xfers = Transfers()
    t = xfers.begin(TransferKind.RESERVE, "r1", T.RESERVING)
    xfers.end(t, exc)
    assert t.state is state and xfers.ended == Counter({(TransferKind.RESERVE, state): 1})
    xfers.end(t, RuntimeError("later"))  # once only
    assert t.state is state and sum(xfers.machines[TransferKind.RESERVE].counts.values()) == 0


def test_a_released_requests_failure_ends_released_and_a_success_still_done():
    xfers = Transfers()
    a, b = xfers.begin(TransferKind.FETCH, "r1", T.RESERVING), xfers.begin(TransferKind.LOAD, "r1", T.COPYING)
    xfers.release("r1")
    with pytest.raises(RuntimeError), a:
        raise RuntimeError("the request was released")
    with b:
        pass
    assert (a.state, b.state, deadline(RuntimeError())) == (T.RELEASED, T.DONE, False)


def test_an_illegal_move_is_refused_counted_and_the_gauge_shows_live_transfers():
    m, xfers = Metrics("traffic_manager"), Transfers()
    xfers.expose(m)
    t = xfers.begin(TransferKind.SAVE, "r1", T.QUEUED)
    assert not xfers.move(t, T.WRITING) and t.state is T.QUEUED
    xfers.move(t, T.COPYING)
    text = m.render().decode()
    assert 'dualpath_traffic_manager_transfers{kind="save",state="copying"} 1.0' in text
    assert "dualpath_traffic_manager_illegal_transitions_total 1.0" in text
    xfers.end(t)  # COPYING -> DONE is not a save's move: refused, still live
    assert t.state is T.COPYING and xfers.live()["save"]["copying"] == 1
    xfers.move(t, T.WRITING)
    xfers.end(t)
    assert 'transfers_ended_total{kind="save",state="done"} 1.0' in m.render().decode()


def _live(mesh: Mesh) -> dict:
    return {name: {k: n for k, states in tm.xfers.live().items() for n in states.values() if n}
            for name, tm in (("pe", mesh.tm), ("de", mesh.de_tm))}


def _ended(mesh: Mesh) -> dict:
    return {name: dict(tm.xfers.ended) for name, tm in (("pe", mesh.tm), ("de", mesh.de_tm))}


def _turn(pe_blocks: int, refuse_writes: str = ""):
    async def go():
        tasks = Tasks()
        mesh = Mesh(tasks)
        mesh.refuse_writes = refuse_writes
        pe, de = Prefill(mesh, tasks), Decode(mesh, tasks)
        try:
            req = await pe.load(work(3, pe_blocks))
            await asyncio.wait_for(pe.prefill(req, layerwise=True), GUARD_S)
            if "r#0" in de.svc.held:
                seq = de.join("r#0")
                for token in range(200, 200 + 2 * 16):
                    await de.step(seq, token)
            await tasks.settle()
            return mesh
        finally:
            de.close()
            mesh.close()
    return asyncio.run(go())


@pytest.mark.parametrize("pe_blocks", [3, 0], ids=["pe-path", "de-path"])
def test_a_turn_ends_every_transfer_it_began_done(pe_blocks):
    mesh = _turn(pe_blocks)
    assert _live(mesh) == {"pe": {}, "de": {}}
    pe, de = _ended(mesh)["pe"], _ended(mesh)["de"]
    assert pe[(TransferKind.FETCH, T.DONE)] == 1 and pe[(TransferKind.PUSH, T.DONE)] == 1
    assert de[(TransferKind.SAVE, T.DONE)] >= 2  # the prompt's missing block (from its slots), generated ones
    assert (TransferKind.STAGE, T.DONE) in de if pe_blocks == 0 else (TransferKind.STAGE, T.DONE) not in de
    assert not [k for k in (*pe, *de) if k[1] is not T.DONE]


def test_a_push_whose_peer_is_gone_ends_failed():
    mesh = _turn(3, refuse_writes="connection to de0 lost")
    assert _live(mesh) == {"pe": {}, "de": {}}
    assert _ended(mesh)["pe"][(TransferKind.PUSH, T.FAILED)] == 1


def test_a_push_of_a_released_request_ends_released():
    async def go():
        tasks = Tasks()
        mesh = Mesh(tasks)
        try:
            state = mesh.tm.layers.hold("r#1")
            reply = Reply()
            reply.ctx = None
            msg = PushKV("r#1", [5, 2], DE, 32, layerwise=True)
            push = asyncio.ensure_future(mesh.push_path.push(msg, reply, state))
            for _ in range(20):
                await asyncio.sleep(0)
            assert mesh.tm.xfers.live()["push"]["copying"] == 1
            mesh.tm.xfers.release("r#1")  # what the service's Release handler does, then fails the layers
            mesh.tm.layers.fail(lambda key: key == "r#1", "the request was released")
            await push
            return mesh, reply.msg
        finally:
            mesh.close()
    mesh, done = asyncio.run(go())
    assert not done.ok and _ended(mesh)["pe"] == {(TransferKind.PUSH, T.RELEASED): 1}


def test_a_prefetch_goes_reading_staged_claimed_done_and_an_unclaimed_one_expires(parts):
    pf = PrefetchPath(parts, chunk_blocks=8, share=1.0)
    keys = _keys(3)
    assert _stage(pf, "s1", keys).blocks == 3 and pf.entries["s1"].state is T.STAGED
    assert _stage(pf, "s2", keys).blocks == 3
    pf.claim("s1", keys)
    assert pf.entries["s1"].state is T.CLAIMED and parts.xfers.live()["prefetch"] == {
        "reading": 0, "staged": 1, "claimed": 1}
    pf.drop("s1", "used")
    pf.expire(float("inf"))
    assert dict(parts.xfers.ended) == {(TransferKind.PREFETCH, T.DONE): 1, (TransferKind.PREFETCH, T.EXPIRED): 1}

