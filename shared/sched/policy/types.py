"""Value types shared by the policy modules: requests, engine reports, assignments.

Frozen msgspec Structs: immutable and hashable like frozen dataclasses, but built in C
(a tenth of a frozen dataclass's cost), since every pull builds one report per engine and
the simulator makes millions. The policy never mutates a report; it copies the counters
it needs.
"""
from __future__ import annotations

from enum import IntEnum

import msgspec


class Request(msgspec.Struct, frozen=True):
    """A request as the policy sees it.

    tokens: len(r), the load proxy added to tok_e (prompt tokens on the PE side,
        prompt + tokens to generate on the DE side — the caller decides).
    mem: KV memory the request needs on a DE (same unit as EngineReport.free_mem);
        unused on the PE side.
    """

    rid: int
    tokens: int
    mem: int = 0


class EngineReport(msgspec.Struct, frozen=True):
    """One engine's line in a group pull (docs/concepts/design.md#engine-groups-and-pulls)."""

    engine: int  # engine id, unique across the cluster
    node: int  # node id (engines of one node are always in the same group)
    seq: int  # seq_e: requests assigned and not finished
    tokens: int  # tok_e: total tokens of those requests
    read_q: int  # read_q(n(e)): storage read queue of the engine's node, tokens
    free_mem: int = 0  # free KV memory (DE only), in the caller's unit


class EngineAssignment(msgspec.Struct, frozen=True):
    """Request `rid` goes to engine `engine`."""

    rid: int
    engine: int


class EngineClass(IntEnum):
    """Algorithm 1's classes of prefill engines."""

    OVERLOADED = 1  # tok_e > beta: never receives work
    IDEAL = 2  # tok_e <= beta and read_q <= alpha
    DISK_PRESSURED = 3  # tok_e <= beta and read_q > alpha
