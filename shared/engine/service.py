"""The engine base both engine services build on: set-up, announcement, held requests, errors.

`stop` answers every held request with a retryable error, so its scheduler resumes it elsewhere.
"""
from __future__ import annotations

import asyncio
import logging
import os
from abc import abstractmethod

from shared.beats import engine_beat_key
from shared.config import ConfigError
from shared.engine.config import EngineConfig
from shared.engine.kv_memory import KVMemory
from shared.engine.requests import EngineRequest
from shared.engine.store_layout import store_layout
from shared.engine.worker import ModelWorker
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.endpoints import EP
from shared.messages.registry import EngineAnnounce
from shared.messages.storage_gateway import StoreLayout
from shared.messages.stream import TokenEvent
from shared.messages.traffic_manager import TmAttached
from shared.runtime import Service

log = logging.getLogger("engine")


def check_device(device: str) -> None:
    """A CUDA device that is not there is a bad setting, said at start (not a crash at the first forward)."""
    if device == "cpu":
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("device", device, "no CUDA device is visible here (torch.cuda.is_available() is False)")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise ConfigError("device", device, f"only {torch.cuda.device_count()} CUDA device(s) are visible")


class EngineService(Service):
    """One engine process: `role` is "prefill" or "decode"; `kv_tag` names its KV segment."""

    role = ""
    kv_tag = "kv"

    def __init__(self, cfg: EngineConfig):
        super().__init__(cfg)
        self.engine = cfg.engine or f"{self.role[:1]}e-{cfg.node}-{os.getpid()}"
        self.held: dict[str, EngineRequest] = {}  # every request this engine holds, by id
        self.wake = asyncio.Event()  # the engine's loop has something to do
        self.loaded = None  # shared.model.loader.LoadedModel, once started
        self.kv: KVMemory | None = None
        self.store: StoreLayout | None = None  # how this engine's blocks are keyed in the store
        self.worker = ModelWorker(cfg.threads, cfg.heap_keep_mb)
        self.m_free = self.metrics.gauge("kv_free_blocks", "Free KV blocks", ("engine",))

    async def load(self) -> None:
        from shared.model.loader import load_model

        cfg = self.cfg
        check_device(cfg.device)
        self.loaded = await self.worker.run(load_model, cfg.model, seed=cfg.seed, dtype=cfg.dtype, device=cfg.device)
        self.kv = KVMemory(self.loaded.config, cfg.kv_blocks, cfg.block_size, tag=self.kv_tag, device=cfg.device,
                           mirror=cfg.kv_mirror)
        self.store = store_layout(self.loaded.model_id, self.loaded.config, cfg.block_size)

    def announce(self) -> EngineAnnounce:
        kv = self.kv
        return EngineAnnounce(
            instance=self.instance, node=self.cfg.node, metrics_url=self.metrics_url, pid=os.getpid(),
            engine=self.engine, role=self.role, group=self.cfg.group or self.cfg.node,
            model_id=self.loaded.model_id if self.loaded else "", max_context=self.max_context(),
            seq=len(self.held), tok=sum(r.tokens for r in self.held.values()),
            free_blocks=kv.alloc.free if kv else 0, total_blocks=kv.alloc.n_slots if kv else 0,
            kv=kv.layout() if kv else None, store=self.store)

    async def watch_tm(self) -> None:
        """Hear this engine's TM attach; a new one (the old process died) ends what the old one was doing."""
        async def on(msg: TmAttached, d) -> None:
            before, self.tm_instance = self.tm_instance, msg.instance
            if before and before != msg.instance and self.kv is not None and msg.shm_name == self.kv.layout().shm_name:
                log.warning("traffic manager restarted (%s -> %s): its copies are gone", before, msg.instance)
                await self.tm_restarted()
        self.tm_instance = ""
        await self.bus.subscribe(self.subjects.at(EP.ENGINE_TM, engine=self.engine), on)

    async def tm_restarted(self) -> None:
        """The engine's TM is a new process: no copy of the old one will land (each engine frees what waited on one)."""

    def beat_key(self, msg: EngineAnnounce) -> object:
        return engine_beat_key(msg)

    def max_context(self) -> int:
        if not self.loaded:
            return 0
        return min(self.loaded.config.max_position, self.cfg.kv_blocks * self.cfg.block_size)

    async def stop(self) -> None:
        for req in list(self.held.values()):
            await self.fail(req, ErrorCode.SHUTTING_DOWN, f"{self.name.replace('_', ' ')} shutting down", retryable=True)
        self.worker.close()
        if self.kv:
            self.kv.close()

    @abstractmethod
    async def fail(self, req: EngineRequest, code: ErrorCode, error: str, retryable: bool = False) -> None:
        """Answer `req` with an error and stop serving it."""

    async def publish_error(self, req: EngineRequest, code: ErrorCode, error: str, retryable: bool = False) -> None:
        """The error event on the request's output subject (index = tokens generated so far)."""
        await self.bus.publish(req.reply, TokenEvent(req.req_id, [], len(req.generated), finish=FinishReason.ERROR,
                                                     error=error, source=self.engine, retryable=retryable, code=code))

    def free_blocks(self, req: EngineRequest) -> None:
        """Give the request's KV blocks back and wake the loop (blocks may admit a waiting one)."""
        if self.kv:
            self.kv.alloc.release(req.req_id)
            self.m_free.labels(self.engine).set(self.kv.alloc.free)
        req.blocks = []
        self.wake.set()

    def note_free(self) -> None:
        if self.kv:
            self.m_free.labels(self.engine).set(self.kv.alloc.free)
