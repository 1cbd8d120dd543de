"""The agent load of the fleet benchmark: agents replaying trajectories over HTTP, one turn at a time.

Each turn's prompt extends the last (the fleet's generated tokens are known without asking),
so it hits what the last one stored. Slots warm-start at a random turn, so the rate is steady at once.
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import httpx
import msgspec
import numpy as np

from dualpath.fleet.store import TOKEN_LO, TOKEN_SPAN, generated_tokens
from dualpath.traces import Trajectory


@dataclass(slots=True)
class Turn:
    """One request as the client saw it (monotonic seconds; the same clock as the emulators')."""

    rid: str
    sent: float
    done: float
    status: int
    prompt: int
    gen: int
    made: int = 0  # completion tokens the reply reported (a completed turn: `gen`)


class _Usage(msgspec.Struct):
    completion_tokens: int = 0


class _Reply(msgspec.Struct):
    id: str = ""
    usage: _Usage = msgspec.field(default_factory=_Usage)


_reply = msgspec.json.Decoder(_Reply)


def _ids(values) -> bytes:
    return msgspec.json.encode(values)[1:-1]


class AgentLoad:
    def __init__(self, url: str, trajectories: list[Trajectory], population: int, seed: int = 0,
                 timeout_s: float = 600.0, stored: Callable[[list[int]], Awaitable[None]] | None = None):
        """`stored(tokens)`: put a warm-started agent's context (its earlier turns) in the store."""
        self.url, self.trajs, self.population, self.stored = url, trajectories, population, stored
        self.rng = random.Random(seed)
        self.timeout_s = timeout_s
        self.turns: list[Turn] = []
        self.errors: dict[str, int] = {}
        self.stopping = False

    async def run(self, duration_s: float, ramp_s: float) -> None:
        """Run until `duration_s`, slots starting spread over `ramp_s`; then let in-flight turns end."""
        limits = httpx.Limits(max_connections=self.population + 8, max_keepalive_connections=self.population + 8)
        async with httpx.AsyncClient(base_url=self.url, limits=limits, timeout=self.timeout_s) as client:
            slots = [asyncio.create_task(self._slot(client, i, self.rng.uniform(0, ramp_s)))
                     for i in range(self.population)]
            await asyncio.sleep(duration_s)
            self.stopping = True
            await asyncio.gather(*slots)

    async def _slot(self, client: httpx.AsyncClient, i: int, delay: float) -> None:
        await asyncio.sleep(delay)
        warm = True
        n = 0
        while not self.stopping:
            traj = self.trajs[(i + n * self.population) % len(self.trajs)]
            start = self.rng.randrange(len(traj.turns)) if warm else 0
            await self._agent(client, traj, start, np.random.default_rng([i, n]))
            warm, n = False, n + 1

    async def _agent(self, client: httpx.AsyncClient, traj: Trajectory, start: int, rng) -> None:
        ctx, ctx_len, first = b"", 0, -1
        earlier: list[int] = []  # a warm start's context, for the store
        for k, (append, gen) in enumerate(traj.turns):
            app = rng.integers(TOKEN_LO, TOKEN_LO + TOKEN_SPAN, size=append).tolist()
            if first < 0:
                first = app[0] if app else TOKEN_LO
            prompt_len = ctx_len + append
            made = generated_tokens(first, prompt_len, gen)
            if k >= start:
                if self.stopping:
                    return
                if earlier and self.stored is not None:
                    await self.stored(earlier)
                    earlier = []
                body = b'{"prompt":[' + ctx + (b"," if ctx and app else b"") + _ids(app) + \
                    b'],"max_tokens":%d,"ignore_eos":true,"temperature":0}' % gen
                if not await self._turn(client, body, prompt_len, gen):
                    return  # the agent failed: a fresh one takes the slot
            if k < start:
                earlier += app + made
            piece = _ids(app + made)
            ctx = ctx + b"," + piece if ctx and piece else ctx or piece
            ctx_len = prompt_len + gen

    async def _turn(self, client: httpx.AsyncClient, body: bytes, prompt: int, gen: int) -> bool:
        sent = time.monotonic()
        try:
            r = await client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            self._error(type(exc).__name__)
            return False
        done = time.monotonic()
        reply = _reply.decode(r.content) if r.status_code == 200 else _Reply()
        self.turns.append(Turn(reply.id, sent, done, r.status_code, prompt, gen, reply.usage.completion_tokens))
        if r.status_code != 200:
            self._error(f"http {r.status_code}")
            return False
        return True

    def _error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1
