"""An agent's hints about its conversation, checked and normalised into the scheduler's `Hint`.

A bad value is a 400 naming the field. Hints never reach the engines, so they cannot change a
generated token. Pure."""
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
