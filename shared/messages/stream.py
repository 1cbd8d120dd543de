"""Token stream back to the scheduler: hot path, so array_like and gc-free."""
from __future__ import annotations

import msgspec


class TokenLogprob(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One generated token as the model saw it: log_softmax of the raw logits (before
    temperature and top-p), for requests that asked for log-probabilities."""

    logprob: float  # of the token actually chosen
    top_ids: list[int] = []  # the most likely ids, most likely first (Sampling.logprobs of them)
    top_logprobs: list[float] = []  # their log-probabilities, same order


class TokenEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    req_id: str
    tokens: list[int]  # new token ids, in order
    index: int = 0  # position of tokens[0] in the generated sequence (0 = first token)
    finish: str = ""  # "" while running; stop | length | error | cancelled
    error: str = ""
    source: str = ""  # engine id that produced the event
    cached_tokens: int = 0  # set on the first event: prompt tokens served from the store
    retryable: bool = False  # an error caused by the mesh (a lost peer, a transfer deadline), not the request
    logprobs: list[TokenLogprob] = []  # one per token in `tokens` when the request asked (Sampling.logprobs)


encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder(TokenEvent)
