"""Work handed to engines, and cancellation.

Sequence for one request (no stored KV):
  scheduler --PrefillWork--> PE (`pe.<id>.work`)
  PE computes the prompt, samples the first token, publishes it on the request's
     output subject, asks its TM to push the KV to the DE's buffer (tm family),
  PE --DecodeAdmit--> DE (`de.<id>.admit`): the KV sits in the DE buffer at `buf_slots`
  DE has its TM copy buffer -> KV memory, frees the buffer, joins the running batch.
  Anyone --Cancel--> `cancel` (broadcast): every holder frees that request's memory.
"""
from __future__ import annotations

import msgspec


class Sampling(msgspec.Struct, omit_defaults=True):
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    ignore_eos: bool = False
    stop_token_ids: list[int] = []


class PrefillWork(msgspec.Struct, omit_defaults=True):
    req_id: str
    prompt: list[int]
    sampling: Sampling
    de_engine: str  # where the KV goes after prefill
    reply: str  # output subject of the scheduler that owns the request
    block_keys: list[str] = []  # hex keys of the prompt's full blocks (chained hashes)
    hit_blocks: int = 0  # leading block_keys present in the store (load instead of compute)
    read_node: str = ""  # the PE's node: its storage-gateway reads the PE-path hit blocks
    mode: str = "dualpath"  # dualpath | basic | oracle (no KV I/O at all: an upper bound)
    pe_blocks: int = -1  # hit blocks [0, pe_blocks) on the PE path, the rest on the DE path; -1 = all PE
    de_node: str = ""  # the DE's node (its storage-gateway reads the DE-path hit blocks)


class DecodeAdmit(msgspec.Struct, omit_defaults=True):
    req_id: str
    prompt_len: int
    first_token: int  # sampled by the PE; the DE computes its KV in its first step
    sampling: Sampling
    reply: str
    buf_slots: list[int]  # DE-buffer byte offsets, one per prompt block, in order
    pe_engine: str = ""
    prompt: list[int] = []  # the prompt's token ids (block hashing for persistence)
    block_keys: list[str] = []  # hex keys of the prompt's full blocks (for persistence)
    persisted_blocks: int = 0  # leading blocks already in the store
    oracle: bool = False  # no KV moved: nothing to load, nothing to persist


class Cancel(msgspec.Struct, omit_defaults=True):
    req_id: str
    reason: str = "cancelled"


class Ack(msgspec.Struct, omit_defaults=True):
    ok: bool = True
    error: str = ""
