"""What an agent's next turn can hit while the store's writes lag: the prefix already written.

`WriteLag` keeps each agent's writes in flight as token spans landing evenly over the write;
booking them on links is engine.py's.
"""
from __future__ import annotations


class WriteLag:
    __slots__ = ("block", "_done", "_flying")

    def __init__(self, block: int) -> None:
        self.block = block
        self._done: dict[int, int] = {}  # agent -> tokens stored for sure (whole blocks)
        self._flying: dict[int, list[tuple[float, float, int, int]]] = {}  # agent -> (t0, t1, from, to)

    def wrote(self, agent: int, t0: float, t1: float, first: int, end: int) -> None:
        """Tokens [first, end) of `agent` (whole blocks) land between t0 and t1."""
        if end > first:
            self._flying.setdefault(agent, []).append((t0, t1, first, end))

    def stored(self, agent: int, now: float) -> int:
        """Tokens of `agent`'s conversation stored by `now`, a whole number of blocks from its start."""
        have = self._done.get(agent, 0)
        spans = self._flying.get(agent)
        while spans:
            t0, t1, first, end = spans[0]
            if first > have:  # a gap (an earlier write missing): the chain stops here
                break
            if now >= t1:
                have = max(have, end)
                self._done[agent] = have
                spans.pop(0)
                continue
            if now > t0:
                part = (end - first) * (now - t0) / (t1 - t0)
                have = max(have, first + int(part // self.block) * self.block)
            break
        return have
