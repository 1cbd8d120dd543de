"""Every agent-hint dialect a request may use, translated into the scheduler's one `Hint`.

Each dialect says some of five things (session, expected return, retention TTL, reuse,
release); where several dialects in one request say the same thing, the first in `ORDER`
decides. Every dialect present is checked even when overridden: a bad value is a 400 naming
the field in its own dialect. docs/guides/agent-hints.md has the table. Pure.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Iterable

from services.scheduler.hint_shapes import CacheControl, KvHints, NvExt, VllmAgentHint
from services.scheduler.hints import parse_hints
from services.scheduler.protocol import AgentHints, ApiError, ChatRequest, CompletionRequest, decode_field
from shared.messages.front import Hint, Reuse

# the fields a request carries hints in, highest precedence first
ORDER = ("agent_hints", "agent_hint", "kv_hints", "nvext", "session_id", "cache_control")
MOONCAKE = {"keep": Reuse.HIGH, "neutral": Reuse.LOW, "discard": Reuse.NONE}  # its reuse_hint values
AGENT_HINT_ACTIONS = ("agent_hint", "kv.agent_hint")  # kv_hints actions whose payload is an `agent_hint`
EPHEMERAL_S = 300.0  # an "ephemeral" cache_control without a ttl: 5 minutes (as Anthropic, Dynamo and vLLM)
MAX_TTL_S = 7 * 86_400.0
UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?")


@dataclass(frozen=True)
class Said:
    """What one dialect says; None where it says nothing."""

    session: str | None = None
    tool_s: float | None = None  # the next turn is due back after this long: prefetch (0: stage at once)
    ttl_s: float | None = None  # retention
    reuse: Reuse | None = None
    release: bool | None = None


def request_hint(req: CompletionRequest | ChatRequest) -> Hint | None:
    """The hints of a decoded request in whatever dialects it uses (None: none)."""
    said = [ours(req.agent_hints), vllm(req.agent_hint, "agent_hint"), kv_hints(req.kv_hints), dynamo(req.nvext),
            sglang(req.session_id), anthropic(req.cache_control)]
    present = [s for s in said if s is not None]
    if not present:
        return None
    m = merge(present)
    return Hint(m.session or "", m.tool_s, m.ttl_s, Reuse.UNSET if m.reuse is None else m.reuse, bool(m.release))


def merge(said: Iterable[Said]) -> Said:
    """Field by field, the first that says something."""
    out: dict = {}
    for s in said:
        for f in fields(Said):
            if out.get(f.name) is None:
                out[f.name] = getattr(s, f.name)
    return Said(**out)


# our own `agent_hints`, and Mooncake's (the same field name) ----------------------------------
def ours(h: AgentHints | None) -> Said | None:
    """Ours, or Mooncake's when the object is one of Mooncake's (`is_mooncake`)."""
    if h is None:
        return None
    level = h.reuse_hint.lower() if isinstance(h.reuse_hint, str) else None
    if level in MOONCAKE:
        if not is_mooncake(h):
            raise ApiError(400, f"agent_hints.reuse_hint {h.reuse_hint!r} is Mooncake's, taken only in an agent_hints "
                                "object of reuse_hint and cache_ttl_ms alone; with our other fields it must be one of "
                                "none, low, medium, high or a probability in [0, 1]", "agent_hints.reuse_hint")
        ttl = None if h.cache_ttl_ms is None else h.cache_ttl_ms / 1000
        return Said(ttl_s=ttl, reuse=MOONCAKE[level])
    hint = parse_hints(h)
    return Said(hint.session or None, hint.tool_s, hint.ttl_s, None if hint.reuse == Reuse.UNSET else hint.reuse,
                hint.release or None)


def is_mooncake(h: AgentHints) -> bool:
    """No key only ours has: Mooncake's `agent_hints` are `reuse_hint` and `cache_ttl_ms` (both ours too)."""
    return not (h.release or any(v is not None for v in (h.session_id, h.workflow_id, h.agent_id, h.step_id,
                                                          h.parent_step_id, h.expected_tool_duration_ms)))


# vLLM ------------------------------------------------------------------------------------------
def vllm(h: VllmAgentHint | None, where: str) -> Said | None:
    """An `agent_hint` (top level, or a kv_hints action's payload at `where`)."""
    if h is None:
        return None
    edits = h.context_management.edits if h.context_management is not None else []
    for i, e in enumerate(edits):
        if e.block_start is not None and e.block_end is not None and e.block_end <= e.block_start:
            raise ApiError(400, f"block_end ({e.block_end}) must be past block_start ({e.block_start}) (exclusive)",
                           f"{where}.context_management.edits[{i}].block_end")
    kinds = {e.type for e in edits}
    return Said(session=h.session_id or None,
                tool_s=0.0 if "prefetch" in kinds else None,  # stage the context for the next turn at once
                ttl_s=h.cache_control.ttl if h.cache_control is not None else None,
                reuse=Reuse.MEDIUM if "offload" in kinds else None,  # kept in the store, not staged
                release=True if "evict" in kinds else None)


def kv_hints(k: KvHints | None) -> Said | None:
    """The envelope's `agent_hint` actions, a later one overriding an earlier one; other actions are ignored."""
    if k is None:
        return None
    said = []
    for i, a in enumerate(k.actions):
        if a.action_type in AGENT_HINT_ACTIONS:
            where = f"kv_hints.actions[{i}].payload"
            said.append(vllm(decode_field(a.payload, VllmAgentHint, where), where))
    return merge(reversed(said)) if said else None


# Dynamo, SGLang, Anthropic ---------------------------------------------------------------------
def dynamo(n: NvExt | None) -> Said | None:
    if n is None or (n.agent_hints is None and n.cache_control is None and n.agent_context is None):
        return None
    ttl = duration_s(n.cache_control.ttl, "nvext.cache_control.ttl") if n.cache_control is not None else None
    warm = n.agent_hints is not None and n.agent_hints.speculative_prefill
    return Said(session=(n.agent_context.trajectory_id if n.agent_context is not None else None) or None,
                tool_s=0.0 if warm else None, ttl_s=ttl)


def sglang(session_id: str | None) -> Said | None:
    """A session's KV is kept until the session closes (POST /close_session) or the default TTL passes."""
    return Said(session=session_id, reuse=Reuse.HIGH) if session_id else None


def anthropic(c: CacheControl | None) -> Said | None:
    return None if c is None else Said(ttl_s=duration_s(c.ttl, "cache_control.ttl"))


def duration_s(value: str | float | None, where: str) -> float:
    """Seconds of a TTL: "5m", "300s", "1h", "1500ms", or a number of seconds (None: 5 minutes)."""
    if value is None:
        return EPHEMERAL_S
    m = _DURATION.fullmatch(value.strip()) if isinstance(value, str) else None
    if isinstance(value, str) and m is None:
        raise ApiError(400, f'{where} must be a duration like "5m", "300s" or "1h" (or seconds), got {value!r}', where)
    seconds = float(m[1]) * UNITS[m[2] or "s"] if m is not None else float(value)
    if not 0 <= seconds <= MAX_TTL_S:
        raise ApiError(400, f"{where} must be between 0 and a week, got {value!r}", where)
    return seconds
