"""The closed vocabularies of the wire, each defined once: load modes, finish reasons, error codes."""
from __future__ import annotations

from enum import StrEnum


class LoadMode(StrEnum):
    """How a request's stored (hit) KV blocks reach the prefill engine."""

    DUALPATH = "dualpath"  # per request, every hit block on the path whose node has the shorter read queue
    DUALPATH_SPLIT = "dualpath-split"  # a request's hit blocks split across both paths so both queues drain together
    BASIC = "basic"  # every hit block on the PE path (the paper's baseline)
    ORACLE = "oracle"  # no KV read, copied or transferred at all: an upper bound whose output is not meaningful

    @property
    def both_paths(self) -> bool:
        """Hit blocks may be read on the DE path too."""
        return self in (LoadMode.DUALPATH, LoadMode.DUALPATH_SPLIT)

    @property
    def moves_kv(self) -> bool:
        """Stored KV is read and KV is transferred (everything but the oracle)."""
        return self is not LoadMode.ORACLE


COMPARED = (LoadMode.BASIC, LoadMode.DUALPATH, LoadMode.ORACLE)  # what sim runs by default (the paper's)
BENCH_MODES = (LoadMode.BASIC, LoadMode.DUALPATH, LoadMode.DUALPATH_SPLIT, LoadMode.ORACLE)  # bench: ours beside them


def mode_names() -> tuple[str, ...]:
    return tuple(m.value for m in LoadMode)


def parse_modes(text: str) -> list[LoadMode]:
    """`"basic,dualpath"` -> those modes in order; ValueError naming the first unknown one (or none given)."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in mode_names()]
    if bad or not names:
        raise ValueError(f"unknown mode {bad[0] if bad else '(none)'} (choose from {', '.join(mode_names())})")
    return [LoadMode(m) for m in names]


class FinishReason(StrEnum):
    """Why a request's stream ended (a running request's events carry None)."""

    STOP = "stop"  # an end-of-sequence or stop token (or a stop string, at the scheduler)
    LENGTH = "length"  # max_tokens, or the context, reached
    ERROR = "error"  # the mesh failed it: the event's `code` says how
    CANCELLED = "cancelled"  # the client left or it was cancelled


class ErrorCode(StrEnum):
    """What failed, on every failure that crosses the bus: receivers branch on this, never on the text."""

    NO_ENGINE = "no_engine"  # no engine can serve the request (none announced, none took it in time)
    PROMPT_TOO_LONG = "prompt_too_long"  # the prompt does not fit an engine's context or KV memory
    ENGINE_FAILED = "engine_failed"  # a forward raised, or an engine holding the request went silent
    KV_TRANSFER = "kv_transfer"  # moving KV between engines failed (push, reserve, load, admit, a peer gone)
    STORAGE = "storage"  # stored KV could not be read (a gateway error, a read past its deadline)
    NOT_READY = "not_ready"  # a traffic-manager asked before its engine's KV memory is attached
    BUFFER_FULL = "buffer_full"  # no DRAM-buffer slots for the request
    CANCELLED = "cancelled"  # the request was cancelled while the work was under way
    SHUTTING_DOWN = "shutting_down"  # the service holding the request is stopping
    BAD_PLAN = "bad_plan"  # the scheduler's KV plan cannot be executed (a bug: never retried)
    INTERNAL = "internal"  # a bug: an error nobody expected
