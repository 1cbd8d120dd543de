"""Requests the scheduler has accepted and not yet answered: their events and timings.

A client never sees a token twice. No I/O."""
from __future__ import annotations

import asyncio

import msgspec
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.messages.codes import ErrorCode, FinishReason, LoadMode
from shared.messages.stream import PromptTiers, TokenEvent
from shared.messages.work import Sampling
from shared.tiers import clip


@dataclass
class InFlight:
    req_id: str
    prompt: list[int]
    sampling: Sampling
    pe: str = ""
    de: str = ""
    arrived: float = field(default_factory=time.monotonic)
    assigned_at: float = 0.0
    queued_at: float = field(default_factory=time.monotonic)  # entered the queue (again, when resumed)
    first_at: float = 0.0
    last_at: float = 0.0
    next_index: int = 0  # index of the next token expected
    cached_tokens: int = 0
    tiers: PromptTiers | None = None  # where the prompt's KV came from (the last attempt's; None: not said)
    tokens: list[int] = field(default_factory=list)  # every token delivered, in order
    finished: FinishReason | None = None  # how its stream ended (None: not yet)
    block_keys: Sequence[bytes] = field(default_factory=list)  # prompt's full-block keys (a worker's: a KeyRun)
    hit_blocks: int = 0  # leading keys present in the store at arrival
    stored_blocks: int = -1  # at the dispatch core: leading keys the store held when the worker asked (-1: not asked)
    mode: LoadMode = LoadMode.DUALPATH  # load mode for this request (deployment default or benchmark override)
    attempt: int = 0  # resumed requests run as new attempts on other engines
    step0: int = 0  # tokens delivered before the current attempt started
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    ctx: object = None  # trace context of the request's root span
    hint: object = None  # the agent's `hints.Hint` (None: no agent_hints); never reaches an engine
    staged: object = None  # `shared.sched.prefetch.Staged`: its prompt's prefix prefetched into a buffer
    reply: str = ""  # at the dispatch core: the front-door worker's output subject ("": the core's own client)
    state: object = None  # its `lifecycle.ReqState` at the dispatch core (written by Lifecycle alone)
    remote_prompt: int = 0  # at the dispatch core: the prompt's length, its ids left with the worker (0: in `prompt`)

    def accept(self, ev: TokenEvent) -> TokenEvent | None:
        """Keep only tokens not seen yet; returns the event to deliver (or None)."""
        if self.finished:
            return None
        skip = max(0, self.next_index - ev.index)
        tokens = ev.tokens[skip:]
        if ev.index > self.next_index:
            return None  # a gap would reorder the stream; engines never produce one
        now = time.monotonic()
        if tokens:
            if not self.first_at:
                self.first_at = now
            self.last_at = now
        self.next_index += len(tokens)
        self.tokens += tokens
        if ev.cached_tokens:
            self.cached_tokens = ev.cached_tokens
        if ev.tiers is not None:  # the attempt's prompt, cut to the request's: cached is what was not computed
            self.tiers = clip(ev.tiers, self.prompt_len)
            self.cached_tokens = self.prompt_len - self.tiers.computed
        if ev.finish:
            self.finished = ev.finish
        if not tokens and not ev.finish:
            return None
        return msgspec.structs.replace(ev, tokens=tokens, index=ev.index + skip, logprobs=ev.logprobs[skip:])

    @property
    def wire_id(self) -> str:
        """The id engines see: one per attempt, so cancelling an old attempt spares the new one."""
        return f"{self.req_id}#{self.attempt}"

    @property
    def work_prompt(self) -> list[int]:
        """The prompt plus every token already streamed (the prompt itself at first: do not mutate)."""
        return self.prompt + self.tokens[: self.step0] if self.step0 else self.prompt

    @property
    def prompt_len(self) -> int:
        return self.remote_prompt or len(self.prompt)

    @property
    def work_len(self) -> int:
        return self.prompt_len + self.step0

    def work_sampling(self) -> Sampling:
        return msgspec.structs.replace(self.sampling, max_tokens=self.sampling.max_tokens - self.step0,
                                       step0=self.step0)

    def restart(self) -> int:
        """Begin a new attempt after the tokens delivered so far; returns the tokens still to generate."""
        self.attempt += 1
        self.queued_at = time.monotonic()
        self.step0 = self.next_index
        self.pe = self.de = ""
        self.hit_blocks = 0
        self.stored_blocks = -1  # the store is asked again for the new attempt
        self.block_keys = []
        # `staged` stays: a fetch that never ran leaves it usable; one that did left nothing to claim
        return self.sampling.max_tokens - self.step0

    def fail(self, code: ErrorCode, error: str) -> None:
        if not self.finished:
            self.events.put_nowait(TokenEvent(self.req_id, [], self.next_index, finish=FinishReason.ERROR, error=error,
                                              code=code))
            self.finished = FinishReason.ERROR

    @property
    def ttft(self) -> float:
        return self.first_at - self.arrived if self.first_at else 0.0

    @property
    def tpot(self) -> float:
        n = self.next_index
        return (self.last_at - self.first_at) / (n - 1) if n > 1 and self.first_at else 0.0
