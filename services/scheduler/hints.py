"""An agent's hints about its conversation, checked and normalised into the scheduler's `Hint`.

Owns the meaning of the `agent_hints` fields a client sends (protocol.AgentHints): which
session a turn belongs to (`session_id`, else `workflow_id`/`agent_id`), whether its next
turn follows a tool call (`expected_tool_duration_ms`: prefetch), how long its stored KV
should outlast unhinted KV in the store (`cache_ttl_ms`, `reuse_hint`: retention), and
`release` (the session is over). Values the types cannot check (a reuse hint that is
neither a level nor a probability) are a 400 naming the field. Pure; hints never reach
the engines, so they cannot change a generated token.

Example: {"session_id": "s1", "expected_tool_duration_ms": 2500} -> Hint(session="s1",
tool_s=2.5, ttl_s=None, reuse=Reuse.UNSET): prefetch about 2.5 s after the turn ends,
retained for the scheduler's default TTL.
"""
from __future__ import annotations

from services.scheduler.protocol import AgentHints, ApiError
from shared.messages.front import Hint, Reuse


LEVELS = {"none": Reuse.NONE, "low": Reuse.LOW, "medium": Reuse.MEDIUM, "high": Reuse.HIGH}


def parse_hints(h: AgentHints | None) -> Hint | None:
    """The request's `agent_hints` as a `Hint` (None: no hints); ApiError(400) naming a bad field."""
    if h is None:
        return None
    session = h.session_id or "/".join(x for x in (h.workflow_id, h.agent_id) if x)
    tool = None if h.expected_tool_duration_ms is None else h.expected_tool_duration_ms / 1000
    ttl = None if h.cache_ttl_ms is None else h.cache_ttl_ms / 1000
    return Hint(session, tool, ttl, _reuse(h.reuse_hint), h.release)


def _reuse(value: str | float | None) -> Reuse:
    if value is None:
        return Reuse.UNSET
    if isinstance(value, str):
        level = LEVELS.get(value.lower())
        if level is not None:
            return level
    elif 0.0 <= value <= 1.0:  # a probability: thirds
        return Reuse.NONE if value == 0 else Reuse.LOW if value < 1 / 3 else Reuse.MEDIUM if value < 2 / 3 \
            else Reuse.HIGH
    raise ApiError(400, f"agent_hints.reuse_hint must be one of {', '.join(LEVELS)} or a probability in [0, 1], "
                        f"got {value!r}", "agent_hints.reuse_hint")
