"""An emulated decode engine: admissions, the running batch and its steps, timed by the compute model.

Speaks the real engine's protocol (`DecodeAdmit` in, `StepEvents` out); a finished sequence's
blocks go to the store index.
"""
from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from dualpath.fleet.prefill import EngineHost
from dualpath.fleet.store import extend_keys, generated_token
from shared.bus import Delivery
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.registry import EngineAnnounce, KVRegion
from shared.messages.stream import StepEvents, TokenEvent
from shared.messages.work import Ack, DecodeAdmit


@dataclass(eq=False)
class Seq:
    req_id: str
    reply: str
    prompt_len: int
    first: int  # the context's first token (what generated ids are a function of)
    tail: list[int]  # the prompt's last partial block (the block persistence completes)
    keys: list[bytes]  # the prompt's full-block keys
    todo: int  # tokens the request may generate in all
    persist: bool  # the plan saves its blocks
    pushed: bool  # its PE pushed its KV: loaded before it runs
    generated: list[int] = field(default_factory=list)
    cancelled: bool = False

    @property
    def need(self) -> int:
        return self.prompt_len + self.todo

    @property
    def ctx(self) -> int:
        return self.prompt_len + len(self.generated)


class DecodeEngine:
    role = "decode"

    def __init__(self, host: EngineHost, engine: str, node: str, instance: str, max_running: int = 256):
        self.host, self.engine, self.node, self.instance = host, engine, node, instance
        bs = host.layout.block_size
        blocks = max(1, host.timing.kv_capacity_tokens() // bs)
        self.kv = KVRegion(f"dp-de-kv-{engine}", blocks, bs, host.layout.n_layers,
                           bs * host.timing.model.kv_bytes, bs * host.timing.model.kv_bytes // host.layout.n_layers)
        self.capacity = blocks * bs
        self.max_running = max_running
        self.held: dict[str, Seq] = {}
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.used = 0  # tokens of KV memory given to loading and running sequences
        self.loading = 0
        self.wake = asyncio.Event()
        self.cancelled: set[str] = set()
        self.steps = self.tokens = 0

    def announce(self) -> EngineAnnounce:
        bs = self.kv.block_size
        return EngineAnnounce(instance=self.instance, node=self.node, metrics_url="", pid=0, engine=self.engine,
                              role=self.role, group=self.node, model_id=self.host.layout.model_id,
                              max_context=self.host.max_context, seq=len(self.held),
                              tok=sum(s.ctx for s in self.held.values()),
                              free_blocks=(self.capacity - self.used) // bs, total_blocks=self.kv.num_blocks,
                              kv=self.kv, store=self.host.layout)

    async def on_admit(self, msg: DecodeAdmit, d: Delivery) -> None:
        if msg.req_id in self.cancelled:
            await d.respond(Ack(False, "request was cancelled", ErrorCode.CANCELLED))
            return
        if msg.prompt_len + 1 > self.host.max_context:
            await d.respond(Ack(False, f"prompt of {msg.prompt_len} tokens exceeds context", ErrorCode.PROMPT_TOO_LONG))
            return
        bs = self.kv.block_size
        tail = msg.prompt[(msg.prompt_len // bs) * bs:]
        s = Seq(msg.req_id, msg.reply, msg.prompt_len, msg.prompt[0] if msg.prompt else 0, tail,
                list(msg.block_keys[: msg.prompt_len // bs]), msg.sampling.max_tokens, msg.persist, bool(msg.buf_slots),
                [msg.first_token])
        self.held[s.req_id] = s
        self.waiting.append(s)
        await d.respond(Ack())
        self.wake.set()

    def cancel(self, req_id: str) -> None:
        self.cancelled.add(req_id)
        if len(self.cancelled) > 4096:
            self.cancelled.clear()
        s = self.held.get(req_id)
        if s is not None:
            s.cancelled = True
            self.wake.set()

    def _start_loads(self) -> None:
        while self.waiting and len(self.running) + self.loading < self.max_running:
            s = self.waiting[0]
            if s.cancelled:
                self.waiting.popleft()
                self._release(s)
                continue
            if self.used + s.need > self.capacity:
                break
            self.waiting.popleft()
            self.used += s.need
            self.loading += 1
            delay = 0.0 if not s.pushed else self.host.timing.transfer_s(s.prompt_len)
            asyncio.get_running_loop().call_later(delay, self._loaded, s)

    def _loaded(self, s: Seq) -> None:
        self.loading -= 1
        self.running.append(s)
        self.wake.set()

    def _release(self, s: Seq) -> None:
        if self.held.pop(s.req_id, None) is not None and s not in self.waiting:
            self.used -= s.need
        self.wake.set()

    async def run(self) -> None:
        timing = self.host.timing
        while True:
            self._start_loads()
            for s in [s for s in self.running if s.cancelled]:
                self.running.remove(s)
                self._release(s)
            if not self.running:
                self.wake.clear()
                await self.wake.wait()
                continue
            batch = list(self.running)
            ctx = sum(s.ctx for s in batch)
            await asyncio.sleep(timing.decode_step_s(len(batch), ctx, sum(timing.capped(s.ctx) for s in batch)))
            await self._step(batch)

    async def _step(self, batch: list[Seq]) -> None:
        self.steps += 1
        out: dict[str, list[TokenEvent]] = {}
        for s in batch:
            if s.cancelled:
                continue
            index = len(s.generated)
            tok = generated_token(s.first, s.prompt_len + index)
            s.generated.append(tok)
            self.tokens += 1
            finish = FinishReason.LENGTH if len(s.generated) >= s.todo else None
            out.setdefault(s.reply, []).append(TokenEvent(s.req_id, [tok], index, finish=finish))
            if finish:
                self.running.remove(s)
                self._persist(s)
                self._release(s)
        for reply, events in out.items():
            await self.host.bus.publish(reply, StepEvents(events, self.engine))

    def _persist(self, s: Seq) -> None:
        if not s.persist:
            return
        lay = self.host.layout
        keys = s.keys
        if len(keys) * lay.block_size == s.prompt_len - len(s.tail):  # the prompt's keys are all known
            keys = keys + extend_keys(keys, s.tail + s.generated, lay.block_size, lay.fingerprint)
        self.host.store.add(keys)
