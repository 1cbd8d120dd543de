"""Traffic-manager control (`{ns}.tm.<engine>.<verb>`). Bytes never ride here.

Push (PE side, after prefill):
  PE --PushKV--> its TM; TM --Reserve--> DE's TM (reply: buffer slots);
  TM writes each KV block from PE KV memory into those slots on the data plane;
  TM --PushDone--> PE (slots, bytes). The PE then admits the request on the DE.
Load (DE side): DE --LoadKV--> its TM: copy buffer slots -> KV blocks, free the slots.
Release: free a request's slots (cancel, failure).
"""
from __future__ import annotations

import msgspec


class PushKV(msgspec.Struct, omit_defaults=True):
    req_id: str
    src_blocks: list[int]  # PE KV block ids, in prompt order
    dst_engine: str  # the DE whose TM buffer receives them
    n_tokens: int = 0


class PushDone(msgspec.Struct, omit_defaults=True):
    ok: bool = True
    error: str = ""
    slots: list[int] = []
    nbytes: int = 0
    seconds: float = 0.0


class Reserve(msgspec.Struct, omit_defaults=True):
    req_id: str
    n_blocks: int


class Reserved(msgspec.Struct, omit_defaults=True):
    ok: bool = True
    error: str = ""
    slots: list[int] = []  # byte offsets in the buffer region, one per block


class LoadKV(msgspec.Struct, omit_defaults=True):
    req_id: str
    slots: list[int]  # buffer offsets, one per block
    dst_blocks: list[int]  # KV block ids, same order
    release: bool = True  # free the slots once copied


class Release(msgspec.Struct, omit_defaults=True):
    req_id: str
