"""The request journal's records, on JetStream (`{ns}.journal.<record>`), JSON-encoded."""
from __future__ import annotations

import msgspec

from shared.messages.work import Sampling


class Accepted(msgspec.Struct, tag="accepted", omit_defaults=True):
    req_id: str
    accepted_at: float  # wall clock (time.time()): unlike monotonic time it means something after a restart
    prompt_tokens: int
    sampling: Sampling
    scheduler: str  # instance that owns the request (a restarted scheduler with a stable --instance finds its own)
    idempotency_key: str = ""  # the client's Idempotency-Key header, when it sent one


class Finished(msgspec.Struct, tag="finished", omit_defaults=True):
    req_id: str
    status: str  # ok | error | cancelled (the scheduler's requests_total label)
    tokens: int = 0  # completion tokens delivered
    finished_at: float = 0.0


Entry = Accepted | Finished
JournalBatch = list[Entry]  # records queued together, written as one message
