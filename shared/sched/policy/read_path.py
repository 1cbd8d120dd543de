"""Read-path choice for a request's hit KV, and the split-read variant."""
from __future__ import annotations

from enum import IntEnum


class ReadPath(IntEnum):
    PE = 0  # storage -> PE node DRAM -> PE HBM
    DE = 1  # storage -> DE node DRAM -> (CNIC) -> PE HBM


NEAR_TIE = 0.5  # queues within this fraction of the longer one count as a tie (0 = exact ties only); 2P4D, 2K agents: SNIC max/avg 1.27 -> 1.18


def choose_path(pe_read_q: int, de_read_q: int, pe_served: int = 0, de_served: int = 0,
                near: float = 0.0) -> ReadPath:
    """Shorter node read queue wins unless within `near` of the longer one: then the node given
    fewer tokens (`*_served`), then PE."""
    if not 0 <= near < 1:
        raise ValueError(f"near must be in [0, 1), got {near!r}")
    if not queues_tie(pe_read_q, de_read_q, near):
        return ReadPath.DE if de_read_q < pe_read_q else ReadPath.PE
    return ReadPath.DE if de_served < pe_served else ReadPath.PE


def queues_tie(pe_read_q: int, de_read_q: int, near: float) -> bool:
    """The two queues differ by at most `near` of the longer one (near = 0: equal)."""
    return abs(pe_read_q - de_read_q) <= near * max(pe_read_q, de_read_q)


def split_read(
    blocks: int,
    pe_read_q: float,
    de_read_q: float,
    pe_rate: float = 1.0,
    de_rate: float = 1.0,
    block_tokens: int = 64,
) -> tuple[int, int]:
    """(blocks on the PE path, blocks on the DE path), summing to `blocks`, so both node queues finish together."""
    if blocks < 0 or block_tokens <= 0 or pe_rate <= 0 or de_rate <= 0:
        raise ValueError("split_read needs blocks >= 0 and positive rates and block size")
    if blocks == 0:
        return 0, 0
    total = pe_read_q + de_read_q + blocks * block_tokens
    finish = total / (pe_rate + de_rate)  # common drain time
    x = (finish * pe_rate - pe_read_q) / block_tokens
    pe_blocks = min(blocks, max(0, round(x)))
    return pe_blocks, blocks - pe_blocks
