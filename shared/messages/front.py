"""Messages between the scheduler's front-door workers and its dispatch core."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import msgspec

from shared.messages.codes import LoadMode
from shared.messages.storage_gateway import StoreLayout
from shared.messages.stream import PromptTiers
from shared.messages.work import PrefillWork, Sampling


class Reuse(enum.IntEnum):
    """How likely the session's KV is reused (a level, or a probability bucketed into one)."""

    NONE = 0  # never again: demote its blocks (evicted before unhinted ones), no prefetch
    LOW = 1  # ordinary LRU: no retention
    UNSET = 2  # not said: retained when a TTL or a tool call says the session comes back
    MEDIUM = 3
    HIGH = 4


@dataclass(frozen=True)
class Hint:
    session: str = ""  # "" = no session named (prefetched blocks are still found by their keys)
    tool_s: float | None = None  # the next turn returns after a tool call of about this long
    ttl_s: float | None = None  # retention asked for (None: the scheduler's default when retained)
    reuse: Reuse = Reuse.UNSET
    release: bool = False

    @property
    def prefetch(self) -> bool:
        return self.tool_s is not None and not self.release and self.reuse != Reuse.NONE

    def retain_s(self, default_s: float) -> float | None:
        """Seconds the session's blocks outrank unhinted ones in the store (None: not retained)."""
        if self.release or self.reuse in (Reuse.NONE, Reuse.LOW):
            return None
        if self.ttl_s is not None:
            return self.ttl_s
        return default_s if self.tool_s is not None or self.reuse > Reuse.UNSET else None


class Submit(msgspec.Struct, tag="submit", omit_defaults=True, gc=False):
    req_id: str
    reply: str  # the worker's output subject: engines and the core answer there
    sampling: Sampling  # the request's own (max_tokens of the whole request)
    prompt: list[int] = []  # attempt 0, when the core needs the ids (see above); else empty
    prompt_tokens: int = 0  # the prompt's length (attempt 0)
    attempt: int = 0
    streamed: list[int] = []  # a resumed attempt: the tokens the client already has
    # of prompt + streamed, under the announced layout, packed end to end (shared.kv.keyrun; empty: the
    # core keys them): one bytes to decode and hold, where a list would be an object per key
    block_keys: bytes = b""
    stored_blocks: int = -1  # leading block_keys the store held when the worker asked it (-1: not asked: the core asks)
    mode: LoadMode = LoadMode.DUALPATH
    hint: Hint | None = None  # the agent's hints, already checked by the worker
    waited_s: float = 0.0  # from the request's arrival at the worker to this message


class PrefillOver(msgspec.Struct, tag="first", omit_defaults=True, gc=False):
    req_id: str
    attempt: int = 0


class Done(msgspec.Struct, tag="done", omit_defaults=True, gc=False):
    req_id: str
    status: str  # ok | error | cancelled
    tokens: list[int] = []  # every generated id (retention keys and the oracle's index need them)
    cached_tokens: int = 0
    ttft_s: float = 0.0
    tpot_s: float = 0.0
    tiers: PromptTiers | None = None  # where the prompt's KV came from (the client's usage; None: not said)


FrontMsg = Submit | PrefillOver | Done


class Forward(msgspec.Struct, gc=False):
    """The core -> a worker: an attempt's work for `pe`, its prompt for the worker to fill in."""
    pe: str
    work: PrefillWork


class FrontInfo(msgspec.Struct, omit_defaults=True):
    model_id: str = ""  # what clients send as `model` (empty: no engine announced one yet)
    model_ids: list[str] = []
    max_context: int = 0
    layout: StoreLayout | None = None


class Ask(msgspec.Struct):
    what: str  # health | mesh | metrics | info | close_session
    session: str = ""  # close_session: the session that is over


class Answer(msgspec.Struct, omit_defaults=True):
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    info: FrontInfo | None = None
