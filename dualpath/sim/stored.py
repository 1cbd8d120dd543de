"""What an agent's next turn can hit while the store's writes lag behind: the prefix of its
blocks already written when the turn arrives.

A finished turn's new full blocks (its prompt's misses, then what it generated) are written
through its decode node's storage NIC. Behind a slow NIC the next turn can arrive before
they are all down; the store then holds only a prefix of the conversation (a chain of
block keys stops at its first missing block), the rest of the prompt is a miss and is
computed again. `WriteLag` keeps, per agent, the writes still in flight as spans of
tokens landing at an even pace between the write's start and end on the NIC (a FIFO link
carries them in order), and answers the stored prefix at a given time. Without it the
simulator counts every earlier full block as stored the moment its turn ends.

Owns: `WriteLag`. Does not own the booking of the writes on the links (`engine.py`).
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
