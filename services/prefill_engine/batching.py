"""Which queued prompts go into the next prefill forward. Pure: values in, decision out.

FIFO: take requests from the head while their tokens fit the batch budget and their
blocks fit free KV memory; the head is always taken if it fits memory at all (a
prompt larger than the budget runs alone rather than starving).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    req_id: str
    tokens: int  # tokens to compute
    blocks: int  # KV blocks the request needs


def take_batch(queue: list[Candidate], max_tokens: int, free_blocks: int) -> list[Candidate]:
    batch: list[Candidate] = []
    tokens = blocks = 0
    for cand in queue:
        if blocks + cand.blocks > free_blocks:
            break
        if batch and tokens + cand.tokens > max_tokens:
            break
        batch.append(cand)
        tokens += cand.tokens
        blocks += cand.blocks
    return batch
