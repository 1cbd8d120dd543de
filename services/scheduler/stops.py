"""Stop sequences over a text stream: hold back text that could be the start of a stop.

The stop sequence itself is never emitted (OpenAI semantics)."""
from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]):
        self.stops = stops
        self.held = ""
        self.keep = max((len(s) for s in stops), default=1) - 1

    def feed(self, delta: str, final: bool = False) -> tuple[str, bool]:
        if not self.stops:
            return delta, False
        text = self.held + delta
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.held = ""
            return text[:cut], True
        if final or self.keep == 0:
            self.held = ""
            return text, False
        self.held = text[-self.keep:]
        return text[: -self.keep] if len(text) > self.keep else "", False
