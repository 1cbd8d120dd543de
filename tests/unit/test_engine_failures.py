"""Engine-side failures answered at once: a stored-KV load that dies mid-layers, a fetch that
cannot be sent, a deadline that is cancelled when the read reports, a decode-side KV load or
save that raises. Pure asyncio with recording stand-ins for the bus (no NATS, no model)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from services.decode_engine.app import DecodeEngineService
from services.decode_engine.config import DecodeEngineConfig
from services.decode_engine.persist import Persister
from services.decode_engine.running import DecodeRequest, RunningSeq
from services.prefill_engine.config import PrefillEngineConfig
from services.prefill_engine.layers import LayerGate, LoadError, LoadProgress
from services.prefill_engine.life import PeState
from services.prefill_engine.record import PrefillRequest
from shared.bus import BusError, Losses
from shared.kv.allocator import SlotAllocator
from shared.kv.window import NO_BLOCK
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.storage_gateway import StoreLayout
from shared.messages.stream import TokenEvent
from shared.messages.traffic_manager import FetchFailed, FetchKV, LayersLoaded, ReadFinished, ReadQueued
from shared.messages.work import DecodeAdmit, PrefillWork, Sampling
from shared.metrics import Metrics
from tests.unit.plan_util import pe_plan
from tests.unit.pe_util import bare_prefill, intake, run

pytestmark = pytest.mark.unit
HUGE = 600.0  # every deadline: a test that finishes did not wait for one
BS = 16
LAYOUT = StoreLayout(fingerprint=bytes(16), model_id="m", n_layers=4, n_kv_heads=1, head_dim=8, dtype="float32",
                     block_size=BS)


class Bus:
    """Records what is published; `fail_with` makes every request raise it (and every publish,
    with `publish_too`)."""

    def __init__(self, fail_with: Exception | None = None, publish_too: bool = False):
        self.losses = Losses()  # the real bus's: engines keep a request's connection
        self.sent: list[tuple[str, object]] = []
        self.fail_with, self.publish_too = fail_with, publish_too

    async def publish(self, subject, msg, ctx=None):
        if self.fail_with and self.publish_too:
            raise self.fail_with
        self.sent.append((subject, msg))

    async def request(self, subject, msg, timeout=5.0, ctx=None, abort=None):
        if self.fail_with:
            raise self.fail_with
        raise AssertionError("no reply scripted")


class KV:
    block_size = BS

    def __init__(self, n: int = 32):
        self.alloc = SlotAllocator(n)

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // BS)


class Engine:
    """A prefill engine service (tests/unit/pe_util.py) over a recording bus: what it queued to compute
    (`queued`) and the errors it answered (`failed`: request, code, error, retryable)."""

    def __init__(self, bus: Bus, tg: asyncio.TaskGroup, window: int = 0, estimate: float = 0.0, kv_blocks: int = 32):
        self.kv = KV(kv_blocks)
        self.failed: list[tuple[str, ErrorCode, str, bool]] = []
        cfg = PrefillEngineConfig(handoff_timeout_s=HUGE, block_size=BS, hit_window_layers=window, engine="pe")
        self.svc = svc = bare_prefill(bus, self.kv, LAYOUT, cfg, tasks=tg)
        svc.s_per_token = estimate / 5  # `submit`'s prompts compute 5 tokens: `estimate` seconds
        self.fetcher, self.held = svc.fetcher, svc.held
        answer = svc.publish_error

        async def publish_error(req, code, error, retryable=False):
            self.failed.append((req.req_id, code, error, retryable))
            await answer(req, code, error, retryable)
        svc.publish_error = publish_error

    @property
    def queued(self) -> list[PrefillRequest]:
        return self.svc.queue

    async def submit(self, rid: str = "r1", hits: int = 3) -> PrefillRequest:
        prompt = list(range(hits * BS + 5))
        work = PrefillWork(rid, prompt, Sampling(), "pe-x", "out", block_keys=[bytes([i]) * 16 for i in range(hits)],
                           plan=pe_plan(hits, "pe"))
        return await intake(self.svc, work)

    async def progress(self, msg) -> None:
        """A report from its traffic manager."""
        await self.svc._on_loaded(msg, None)


def test_a_read_that_reports_cancels_its_deadline_task():
    async def go(tg):
        eng = Engine(Bus(), tg)
        req = await eng.submit()
        timer = req.timer
        assert req.state is PeState.READING and req.read_pending and timer is not None and not timer.done()
        await eng.progress(ReadFinished("r1", 3))
        await asyncio.sleep(0)
        assert timer.cancelled() and req.timer is None and not req.read_pending
        assert eng.queued == [req] and req.hit_tokens == 3 * BS and not eng.failed
    run(go)


def test_a_layer_copy_that_dies_fails_the_request_and_wakes_the_model_thread():
    async def go(tg):
        eng = Engine(Bus(), tg)
        req = await eng.submit()
        await eng.progress(ReadFinished("r1", 3))
        await eng.progress(LayersLoaded("r1", 0))
        caught: list[BaseException] = []

        def model_thread():  # the forward, blocked before layer 1 with a 600 s layer timeout
            try:
                LayerGate([req.load], HUGE).before_layer(1)
            except LoadError as exc:
                caught.append(exc)

        t = threading.Thread(target=model_thread, daemon=True)  # daemon: a broken fail() must not hang the run
        t.start()
        await eng.progress(FetchFailed("r1", ErrorCode.KV_TRANSFER, "copy failed: peer gone"))
        while t.is_alive():  # the model thread wakes when fail() reaches it
            await asyncio.sleep(0.005)
        assert isinstance(caught[0], LoadError) and caught[0].layer == 1 and "peer gone" in caught[0].reason
        assert caught[0].code is ErrorCode.KV_TRANSFER
        assert eng.failed == [("r1", ErrorCode.KV_TRANSFER, "stored KV load failed: copy failed: peer gone", True)]
    run(go)


def test_a_short_read_only_shortens_the_hits():
    async def go(tg):  # one of three blocks verified: it still counts, the rest is computed
        eng = Engine(Bus(), tg)
        req = await eng.submit()
        await eng.progress(ReadFinished("r1", 1))
        assert eng.queued == [req] and req.hit_tokens == BS and not eng.failed and not req.load.error
    run(go)


def test_hits_in_a_window_take_a_ring_and_a_short_read_gives_the_rest_blocks_of_their_own():
    async def go(tg):
        eng = Engine(Bus(), tg, window=2)  # LAYOUT has 4 layers: the hits hold two at a time
        req = await eng.submit(hits=4)
        assert req.window is not None and req.window.hits == 4 and len(req.window.ring) == 2  # 4 x 2 / 4 layers
        assert req.blocks[:4] == [NO_BLOCK] * 4 and len(req.blocks) == 5
        for _ in range(5):
            await asyncio.sleep(0)  # the fetch is sent by its own task
        fetch = next(m for _, m in eng.fetcher.bus.sent if isinstance(m, FetchKV))
        assert fetch.window.hits == 4 and fetch.window.ring == list(req.window.ring)
        assert eng.kv.alloc.free == 32 - 3
        await eng.progress(ReadFinished("r1", 1))  # one hit found: three blocks are computed now
        assert req.window.in_ring == 1 and NO_BLOCK not in req.blocks[1:] and eng.kv.alloc.free == 32 - 6
        assert eng.queued == [req] and req.hit_tokens == BS
    run(go)


def test_a_read_joins_the_queue_when_its_end_is_its_own_compute_time_away():
    async def go(tg):
        eng = Engine(Bus(), tg, estimate=0.05)
        req = await eng.submit()
        await eng.progress(ReadFinished("r1", 3, eta_s=0.15))  # joins 0.1 s from now
        assert eng.queued == [] and not req.read_pending and req.state is PeState.LOADING
        while not eng.queued:
            await asyncio.sleep(0.01)
        assert eng.queued == [req]
    run(go)


def test_a_fetch_that_fails_before_its_read_finished_is_a_miss():
    async def go(tg):  # nothing reached KV memory: the whole prompt is computed, nothing fails
        eng = Engine(Bus(), tg)
        req = await eng.submit()
        await eng.progress(FetchFailed("r1", ErrorCode.NOT_READY, "engine KV memory not attached yet"))
        assert eng.queued == [req] and req.hit_tokens == 0 and req.load is None and not eng.failed
        assert not req.read_pending and req.timer is None
    run(go)


def test_a_fetch_that_cannot_be_sent_fails_at_once():
    async def go(tg):
        eng = Engine(Bus(fail_with=BusError("tm.pe.fetch", "connection closed"), publish_too=True), tg)
        req = await eng.submit()
        for _ in range(10):
            await asyncio.sleep(0)
        assert [(r, code, retry) for r, code, _, retry in eng.failed] == [("r1", ErrorCode.STORAGE, True)]
        assert not req.read_pending and req.timer is None
    run(go)


def test_a_queued_read_pushes_its_deadline_back():
    async def go(tg):
        eng = Engine(Bus(), tg)
        req = await eng.submit()
        before = req.deadline
        await eng.progress(ReadQueued("r1", 50.0))
        assert req.deadline >= before + 49.0 and req.read_pending
    run(go)


def test_load_progress_fail_wakes_a_waiter_without_its_timeout():
    p = LoadProgress("r")
    done = threading.Event()

    def wait():
        with pytest.raises(LoadError):
            p.wait(0, HUGE)
        done.set()

    t = threading.Thread(target=wait)
    t.start()
    p.fail("gone")
    t.join()
    assert done.is_set()


# --- decode side ----------------------------------------------------------------------------------

def decode_engine(bus: Bus) -> DecodeEngineService:
    svc = DecodeEngineService(DecodeEngineConfig(engine="de-t", load_timeout_s=HUGE))
    svc.bus = bus
    return svc


def admitted(svc: DecodeEngineService) -> DecodeRequest:
    admit = DecodeAdmit("d1", 20, 7, Sampling(max_tokens=4), "out", [0, 4096])
    req = DecodeRequest("d1", list(range(20)), admit.sampling, "out", None, admit=admit, generated=[7])
    svc._hold(req)
    svc._loading(req, [])  # its KV blocks taken: the load starts
    return req


@pytest.mark.parametrize("exc,code", [(RuntimeError("boom"), ErrorCode.INTERNAL),
                                      (BusError("tm.de-t.load", "timeout"), ErrorCode.KV_TRANSFER),
                                      (BusError("tm.de-t.load", "full", ErrorCode.BUFFER_FULL), ErrorCode.BUFFER_FULL)])
def test_a_kv_load_that_raises_fails_only_its_request(exc, code):
    async def go():
        bus = Bus(fail_with=exc)
        svc = decode_engine(bus)
        req = admitted(svc)
        await svc._load(req)  # raises nothing: answered on the wire instead
        return bus, svc, req

    bus, svc, req = asyncio.run(go())
    svc.worker.close()
    events = [m for _, m in bus.sent if isinstance(m, TokenEvent)]
    assert len(events) == 1 and events[0].finish is FinishReason.ERROR and events[0].retryable
    assert events[0].code is code
    assert "KV load failed" in events[0].error and req.req_id not in svc.held and not svc.ready


def test_a_save_that_raises_ends_its_request_and_still_releases_it():
    async def go():
        bus = Bus(fail_with=RuntimeError("encoder broke"))
        failures, released = [], []
        async with asyncio.TaskGroup() as tg:
            p = Persister(LAYOUT, "n0", bus, "tm.de.save", HUGE, lambda coro, name=None: tg.create_task(coro),
                          Metrics("test-persist"), release=released.append,
                          on_failure=lambda r, e: failures.append((r.req_id, e)))
            req = DecodeRequest("d1", list(range(BS)), Sampling(), "out", None, blocks=[3, 4])
            req.generated = list(range(BS))
            seq = RunningSeq(req, pos=2 * BS, last=0, max_pos=64)
            p.prompt(seq, DecodeAdmit("d1", BS, 0, Sampling(), "out", [0], block_keys=[b"\xab" * 16]))
            p.generated(seq, 1)  # decoding filled the second block: it is copied out of KV memory
            assert p.busy("d1")
            p.release_later(req)  # finished while its save was in flight
        assert failures and failures[0][0] == "d1" and "encoder broke" in failures[0][1]
        assert released == [req] and not p.busy("d1")

    asyncio.run(go())
