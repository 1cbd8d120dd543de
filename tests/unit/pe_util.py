"""A prefill engine service without a model or NATS: its real intake, state machine, fetch and
hand-off over a stand-in bus, KV memory and task spawner; the test plays its forward."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace

from opentelemetry import trace

from services.prefill_engine.app import PrefillEngineService
from services.prefill_engine.batching import Chunk
from services.prefill_engine.config import PrefillEngineConfig
from services.prefill_engine.life import PeState
from services.prefill_engine.record import PrefillRequest
from shared.messages.codes import FinishReason
from shared.messages.storage_gateway import StoreLayout
from shared.messages.stream import TokenEvent
from shared.messages.work import PrefillWork


def bare_prefill(bus, kv, store: StoreLayout, cfg: PrefillEngineConfig, *, spawn: Callable | None = None,
                 tasks: asyncio.TaskGroup | None = None) -> PrefillEngineService:
    """The service as `start` leaves it, over `bus` and `kv` (its model thread never used); its tasks
    spawned by `spawn`, or supervised (`Service.spawn`) in `tasks`."""
    svc = PrefillEngineService(cfg)
    svc.bus, svc.kv, svc.store, svc.tasks = bus, kv, store, tasks
    svc.loaded = SimpleNamespace(model_id=store.model_id, config=SimpleNamespace(n_layers=store.n_layers, eos_ids=(),
                                                                              max_position=1 << 16))
    if spawn is not None:
        svc.spawn = spawn
    svc.parts()
    return svc


async def intake(svc: PrefillEngineService, work: PrefillWork) -> PrefillRequest:
    """`work` arrives; a request with hits gets its KV blocks and its read (or its copy) now."""
    await svc._on_work(work, SimpleNamespace(ctx=None))
    req = svc.held[work.req_id]
    await svc.do(svc.fetcher.start())
    return req


def finish_forward(svc: PrefillEngineService, req: PrefillRequest, first: int | None) -> None:
    """Its forward (of the rest of its prompt) is over, with `first` sampled (None: a chunk): as the
    engine goes on after one (its hand-off is spawned)."""
    if req.state is PeState.READY:
        svc.move(req, PeState.COMPUTING, "the test's forward")
    chunk = Chunk(req, req.done, len(req.prompt) - req.done)
    svc._after_step(chunk, trace.INVALID_SPAN, None if first is None else (first, None))


def errors(sent: list[tuple[str, object]]) -> list[TokenEvent]:
    """The error events among what a stand-in bus heard."""
    return [m for _, m in sent if isinstance(m, TokenEvent) and m.finish is FinishReason.ERROR]


def run(test):
    """`test(task_group)` in a fresh event loop; tasks it left running are cancelled at its end."""
    async def go():
        async with asyncio.TaskGroup() as tg:
            await test(tg)
            for t in asyncio.all_tasks() - {asyncio.current_task()}:
                t.cancel()  # a test that left a deadline asleep still ends (its assertions say so)
    asyncio.run(go())
