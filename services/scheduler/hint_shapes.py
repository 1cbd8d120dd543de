"""The request shapes of the agent-hint dialects the front door takes besides its own `agent_hints`.

Pure msgspec Structs, decoded with the request body (protocol.py), so a value of the wrong
type is a 400 whose `param` is the field's path in the client's own dialect (e.g.
`nvext.cache_control.ttl`). Unknown fields are ignored. What each field means here is
hint_dialects.py's job; docs/guides/agent-hints.md has the table.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

HintId = Annotated[str, msgspec.Meta(max_length=256)]  # a session (or workflow, agent) id
Ms = Annotated[float, msgspec.Meta(ge=0, le=7 * 86_400_000)]  # a duration in milliseconds: 0 .. a week
Block = Annotated[int, msgspec.Meta(ge=0)]  # a block index into the request's context
Duration = Annotated[str | float | None, msgspec.Meta(
    description='"5m", "300s", "1h" (or seconds); null: 5 minutes')]


# vLLM: the session-aware KV cache hints RFC (`agent_hint`) and its versioned envelope (`kv_hints`)
class VllmCacheControl(msgspec.Struct, kw_only=True):
    type: Literal["ephemeral"] = "ephemeral"
    ttl: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 300.0  # seconds
    block_offset: Block | None = None  # accepted; the whole context is retained


class ContextEdit(msgspec.Struct, kw_only=True):
    type: Literal["offload", "prefetch", "evict"]
    block_start: Block | None = None  # accepted; an edit applies to the whole context
    block_end: Block | None = None  # (exclusive)


class ContextManagement(msgspec.Struct, kw_only=True):
    manage_request: bool = False
    edits: list[ContextEdit] = []


class VllmAgentHint(msgspec.Struct, kw_only=True):
    session_id: HintId | None = None
    parent_session_id: HintId | None = None  # accepted, not used
    cache_control: VllmCacheControl | None = None
    context_management: ContextManagement | None = None


class KvAction(msgspec.Struct, kw_only=True):
    action_type: str  # "agent_hint" (or "kv.agent_hint"): the payload is an `agent_hint`; others are ignored
    action_id: str | int | None = None
    action_version: str | int | None = None
    payload: Any = None  # typed by action_type (hint_dialects.py)


class KvHints(msgspec.Struct, kw_only=True):
    protocol_version: str | int | None = None
    message_id: str | int | None = None
    actions: list[KvAction] = []


# Dynamo: `nvext`
class DynamoAgentHints(msgspec.Struct, kw_only=True):
    priority: int | None = None  # accepted, not used
    strict_priority: int | None = None  # accepted, not used
    osl: Block | None = None  # expected output tokens: accepted, not used
    speculative_prefill: bool = False  # warm the next turn's prefix when this one ends


class CacheControl(msgspec.Struct, kw_only=True):
    """Anthropic's `cache_control` (top level) and Dynamo's `nvext.cache_control`."""

    type: Literal["ephemeral"] = "ephemeral"
    ttl: Duration = None


class AgentContext(msgspec.Struct, kw_only=True):
    trajectory_id: HintId | None = None  # the session


class NvExt(msgspec.Struct, kw_only=True):
    agent_hints: DynamoAgentHints | None = None
    cache_control: CacheControl | None = None
    agent_context: AgentContext | None = None


# SGLang: the session endpoints' bodies (sessions_api.py); its requests name the session at the top level
class OpenSession(msgspec.Struct, kw_only=True):
    session_id: HintId | None = None  # none: the front door makes one up
    capacity_of_str_len: int | None = None  # accepted, not used
    streaming: bool | None = None  # accepted, not used
    timeout: float | None = None  # accepted, not used


class CloseSession(msgspec.Struct, kw_only=True):
    session_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
