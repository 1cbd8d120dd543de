"""Value types shared by the policy modules: requests, engine reports, assignments."""
from __future__ import annotations

from enum import IntEnum

import msgspec


class Request(msgspec.Struct, frozen=True):
    rid: int
    tokens: int  # len(r), added to tok_e: prompt tokens on the PE side, prompt + to generate on the DE side
    mem: int = 0  # KV memory it needs on a DE, in EngineReport.free_mem's unit


class EngineReport(msgspec.Struct, frozen=True):
    engine: int  # engine id, unique across the cluster
    node: int  # node id (engines of one node are always in the same group)
    seq: int  # seq_e: requests assigned and not finished
    tokens: int  # tok_e: total tokens of those requests
    read_q: int  # read_q(n(e)): storage read queue of the engine's node, tokens
    free_mem: int = 0  # free KV memory (DE only), in the caller's unit


class EngineAssignment(msgspec.Struct, frozen=True):
    rid: int
    engine: int


class EngineClass(IntEnum):
    OVERLOADED = 1  # tok_e > beta: never receives work
    IDEAL = 2  # tok_e <= beta and read_q <= alpha
    DISK_PRESSURED = 3  # tok_e <= beta and read_q > alpha
