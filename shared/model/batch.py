"""ForwardBatch: what one forward step computes, and where its K/V live in the cache.

There is no prefill or decode mode: each sequence slice says which new tokens to
compute (token_ids), at which positions (start_pos ..), and which cache blocks hold the
sequence (block_table). Prefill is start_pos = cached tokens with many new tokens;
decode is one new token per sequence. Example, block_size 4:

    SeqSlice(token_ids=[7, 8, 9], start_pos=5, block_table=[12, 3])
    -> positions 5, 6, 7 are written to block 3 rows 1, 2, 3; attention of the token
       at position 6 reads positions 0..6 (0..3 from block 12, 4..6 from block 3).

A slice may keep its stored hits in a window (`window`, shared/kv/window.py): their
blocks then have no entry of their own in `block_table` (NO_BLOCK), and layer l of them
lives in the window's ring; the model reads each layer through that layer's block table.

Pure data, no torch: the engines build batches without touching the model.
"""

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
        """One past the last position computed (= context length after this step)."""
        return self.start_pos + len(self.token_ids)

    def check(self, block_size: int) -> None:
        """Raise ValueError if the slice is empty or its blocks do not cover it."""
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
