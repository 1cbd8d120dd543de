"""Engine output routed to the requests it names: the one path both front doors share.

An old attempt's output is dropped, a retryable failure goes to `resume`, and the rest is
renumbered after earlier attempts' tokens and de-duplicated."""
from __future__ import annotations

import logging
from typing import Callable

import msgspec

from services.scheduler.inflight import InFlight
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.stream import Output, TokenEvent

log = logging.getLogger("scheduler")


class OutputRouter:
    def __init__(self, inflight: dict[str, InFlight], resume: Callable[[InFlight, TokenEvent, str], bool],
                 on_first: Callable[[InFlight, str], None], on_error: Callable[[], None] = lambda: None):
        self.inflight, self.resume, self.on_first, self.on_error = inflight, resume, on_first, on_error

    def route(self, msg: Output) -> None:
        if isinstance(msg, TokenEvent):
            self.event(msg, msg.source)
            return
        for ev in msg.events:
            try:
                self.event(ev, msg.source)
            except Exception:  # noqa: BLE001 - one bad entry must not cost the step's other requests
                log.exception("output event for %s failed; dropped", ev.req_id)
                self.on_error()

    def event(self, ev: TokenEvent, source: str) -> None:
        base, _, attempt = ev.req_id.partition("#")
        rec = self.inflight.get(base)
        if rec is None or attempt != str(rec.attempt):
            return  # an old attempt of a resumed request
        if ev.finish == FinishReason.ERROR and ev.retryable and self.resume(rec, ev, source):
            return
        ev = msgspec.structs.replace(ev, req_id=base, index=ev.index + rec.step0, source=source)
        if ev.index > rec.next_index and not rec.finished:  # an event was lost on the way: the rest cannot follow
            gap = TokenEvent(base, [], rec.next_index, finish=FinishReason.ERROR, source=source, retryable=True,
                             code=ErrorCode.ENGINE_FAILED, error=f"tokens {rec.next_index}..{ev.index - 1} lost in transit")
            if not self.resume(rec, gap, ""):
                rec.fail(ErrorCode.ENGINE_FAILED, gap.error)
            return
        out = rec.accept(ev)
        if out is not None:
            if out.index == rec.step0:  # this attempt's prefill is over: its reads are done, its PE is free
                self.on_first(rec, source)
            elif not rec.de:  # a front-door worker learns the decode engine from its steps
                rec.de = source
            rec.events.put_nowait(out)
