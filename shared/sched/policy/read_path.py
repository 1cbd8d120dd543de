"""Read-path choice for a request's hit KV (docs/concepts/design.md#read-path-choice) and the split-read variant.

`choose_path`: the path whose node has the shorter storage read queue; a tie (queues are
often both empty) goes to the node that has been given fewer tokens to read, so bytes balance
(an even tie: the PE path, one hop fewer). `split_read`: divide a request's hit blocks between both
nodes so both queues, each drained at its node's read rate, finish together.

Example: pe_q=1000, de_q=0 tokens, equal rates, 10 blocks of 64 tokens (640 tokens):
the DE side takes (1000 + 640) / 2 = 820 tokens -> 13 blocks is more than 10, so all
10 go to the DE path (0, 10). With pe_q=100, de_q=0: T = 370, DE gets 370 tokens ->
6 blocks (384), PE 4 (256): both queues end near 356..384.
"""
from __future__ import annotations

from enum import IntEnum


class ReadPath(IntEnum):
    """Where the hit KV is read from storage."""

    PE = 0  # storage -> PE node DRAM -> PE HBM
    DE = 1  # storage -> DE node DRAM -> (CNIC) -> PE HBM


def choose_path(pe_read_q: int, de_read_q: int, pe_served: int = 0, de_served: int = 0) -> ReadPath:
    """Shorter node read queue wins; a tie goes to the node given fewer tokens so far (`*_served`),
    an even one to the PE path."""
    if de_read_q != pe_read_q:
        return ReadPath.DE if de_read_q < pe_read_q else ReadPath.PE
    return ReadPath.DE if de_served < pe_served else ReadPath.PE


def split_read(
    blocks: int,
    pe_read_q: float,
    de_read_q: float,
    pe_rate: float = 1.0,
    de_rate: float = 1.0,
    block_tokens: int = 64,
) -> tuple[int, int]:
    """(blocks on the PE path, blocks on the DE path), summing to `blocks`.

    Solves (pe_q + x*bt)/pe_rate == (de_q + (n-x)*bt)/de_rate for x, rounds to whole
    blocks, and clamps to [0, n]. Rates are read speeds in tokens per unit time.
    """
    if blocks < 0 or block_tokens <= 0 or pe_rate <= 0 or de_rate <= 0:
        raise ValueError("split_read needs blocks >= 0 and positive rates and block size")
    if blocks == 0:
        return 0, 0
    total = pe_read_q + de_read_q + blocks * block_tokens
    finish = total / (pe_rate + de_rate)  # common drain time
    x = (finish * pe_rate - pe_read_q) / block_tokens
    pe_blocks = min(blocks, max(0, round(x)))
    return pe_blocks, blocks - pe_blocks
