"""Engine output back to the scheduler (`{ns}.scheduler.<scheduler>.out`): hot path, so compact."""
from __future__ import annotations

from dataclasses import dataclass

import msgspec

from shared.messages.codes import ErrorCode, FinishReason


class TokenLogprob(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One generated token's log_softmax of the raw logits (before temperature and top-p)."""

    logprob: float  # of the token actually chosen
    top_ids: list[int] = []  # the most likely ids, most likely first (Sampling.logprobs of them)
    top_logprobs: list[float] = []  # their log-probabilities, same order


class PromptTiers(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Where one prefill's prompt tokens came from, in tokens; the five sum to the prompt's length."""

    computed: int = 0  # prefilled by the forward: no stored KV for them (a miss, the prompt's tail)
    engine: int = 0  # taken as already in the engine's KV memory: the oracle's hits (no mode reuses KV there)
    buffer: int = 0  # copied from a traffic-manager's DRAM buffer: prefetched in a tool call, or a kept turn
    storage_pe: int = 0  # read from the store by the PE node's gateway (the PE's storage NIC)
    storage_de: int = 0  # read by the DE node's gateway into the DE's buffer, pulled from there by the PE


class TokenEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    req_id: str
    tokens: list[int]  # new token ids, in order
    index: int = 0  # position of tokens[0] in the generated sequence (0 = first token)
    finish: FinishReason | None = None  # None while running
    error: str = ""  # what failed, for people (logs, the client's message); receivers branch on `code`
    source: str = ""  # engine id that produced the event (empty inside a StepEvents: it says once)
    cached_tokens: int = 0  # set on the first event: prompt tokens served from the store
    retryable: bool = False  # an error caused by the mesh (a lost peer, a transfer deadline), not the request
    logprobs: list[TokenLogprob] = []  # one per token in `tokens` when the request asked (Sampling.logprobs)
    code: ErrorCode | None = None  # with finish=error: what failed (the scheduler's HTTP status follows from it)
    tiers: PromptTiers | None = None  # on a prefill engine's first token: where the prompt's KV came from


@dataclass(frozen=True, slots=True)
class StepEvents:
    """One decode step's output for one reply subject, in batch order. A dataclass, not a Struct: it
    encodes as a map, so the `Output` decoder tells it from TokenEvent's array."""

    events: list[TokenEvent]  # one per request: its token of this step (and finish, logprobs)
    source: str = ""  # the engine that ran the step


Output = TokenEvent | StepEvents  # what arrives on a scheduler's output subject

encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder(Output)
