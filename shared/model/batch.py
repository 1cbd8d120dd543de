"""ForwardBatch: what one forward step computes, and where its K/V live (no torch)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from shared.kv.window import HitWindow


@dataclass(frozen=True)
class SeqSlice:
    token_ids: list[int]  # the new tokens to compute
    start_pos: int  # position of token_ids[0]; positions < start_pos are in the cache
    block_table: list[int]  # cache block of each block_size positions of the sequence
    window: HitWindow | None = None  # its first window.hits blocks live in a ring, layer by layer

    @property
    def end_pos(self) -> int:
        return self.start_pos + len(self.token_ids)

    def check(self, block_size: int) -> None:
        if not self.token_ids or self.start_pos < 0:
            raise ValueError(f"bad slice: {len(self.token_ids)} tokens at {self.start_pos}")
        need = -(-self.end_pos // block_size)
        if len(self.block_table) < need:
            raise ValueError(f"block_table has {len(self.block_table)} blocks, need {need}")


@dataclass(frozen=True)
class ForwardBatch:
    seqs: list[SeqSlice] = field(default_factory=list)  # one slice per sequence, in order

    def __iter__(self) -> Iterator[SeqSlice]:
        return iter(self.seqs)

    def __len__(self) -> int:
        return len(self.seqs)
