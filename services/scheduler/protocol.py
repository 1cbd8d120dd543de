"""The OpenAI-style HTTP protocol: request bodies, validation, errors, response bodies.

A validation failure is an `ApiError` (4xx JSON). No I/O."""
from __future__ import annotations

import re
import time
import uuid
from typing import Annotated

import msgspec

from services.scheduler.hint_shapes import CacheControl, HintId, KvHints, Ms, NvExt, VllmAgentHint
from shared.messages.codes import ErrorCode, FinishReason, LoadMode, mode_names
from shared.messages.stream import PromptTiers
from shared.tiers import as_dict

CHOICES = {"dualpath_mode": mode_names()}  # fields whose bad value is answered with the values they take
MAX_LOGPROBS = 20  # most alternatives a token may report (OpenAI's and vLLM's default limit)

TopN = Annotated[int, msgspec.Meta(ge=0, le=MAX_LOGPROBS)]
COMPLETION_MAX_TOKENS = 16  # /v1/completions without max_tokens (OpenAI's legacy default); chat: to the context's end


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: ErrorCode | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        """OpenAI's error shape; `code` is the mesh's ErrorCode when the mesh failed it, else the status."""
        code = self.status if self.code is None else self.code.value
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": code}}


HTTP_STATUS = {ErrorCode.NO_ENGINE: 503, ErrorCode.SHUTTING_DOWN: 503, ErrorCode.PROMPT_TOO_LONG: 400}  # else 500
_KINDS = {503: "service_unavailable", 400: "invalid_request_error"}


def failure(code: ErrorCode | None, message: str) -> ApiError:
    """The answer to a request the mesh failed; its status follows from the code (None: 500)."""
    status = HTTP_STATUS.get(code, 500) if code is not None else 500
    return ApiError(status, message, kind=_KINDS.get(status, "engine_error"), code=code or ErrorCode.INTERNAL)


class ChatMessage(msgspec.Struct):
    role: str
    content: str


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False  # OpenAI: a last chunk with empty choices and the usage


class AgentHints(msgspec.Struct, kw_only=True):
    """What an agent knows about the conversation's future; unknown fields ignored, tokens unchanged."""

    session_id: HintId | None = None  # the conversation; without it, workflow_id/agent_id name it
    workflow_id: HintId | None = None
    agent_id: HintId | None = None
    step_id: HintId | int | None = None  # accepted for compatibility; not used
    parent_step_id: HintId | int | None = None
    expected_tool_duration_ms: Annotated[Ms | None, msgspec.Meta(
        description="a tool call runs after this turn; the session's next turn comes back in about this long "
                    "(its stored KV is read into a buffer meanwhile)")] = None
    cache_ttl_ms: Annotated[Ms | None, msgspec.Meta(
        description="keep the session's stored KV ahead of unhinted KV in the store's eviction for this long")] = None
    reuse_hint: Annotated[str | float | None, msgspec.Meta(
        description="none | low | medium | high, or a probability in [0, 1]: how likely the KV is reused "
                    "(Mooncake's keep | neutral | discard in an object of reuse_hint and cache_ttl_ms alone)")] = None
    release: bool = False  # the session is over: end its retention, drop what was prefetched for it


class _Common(msgspec.Struct, kw_only=True):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM extension: generate exactly max_tokens
    return_token_ids: bool = False  # vLLM extension: prompt and completion token ids in the choice
    dualpath_mode: LoadMode | None = None  # benchmark override of the deployment's load mode
    agent_hints: AgentHints | None = None  # agent-aware KV: retention, prefetch during tool calls, release
    # the same in other servers' dialects (hint_dialects.py; docs/guides/agent-hints.md)
    agent_hint: VllmAgentHint | None = None  # vLLM's session-aware KV cache hints
    kv_hints: KvHints | None = None  # vLLM's versioned envelope: `agent_hint` actions
    nvext: NvExt | None = None  # Dynamo: agent_hints, cache_control, agent_context (the rest is ignored)
    session_id: HintId | None = None  # SGLang's session (closed by POST /close_session)
    cache_control: CacheControl | None = None  # Anthropic-style prompt caching: {"type": "ephemeral", "ttl": "1h"}
    n: int = 1


class CompletionRequest(_Common, kw_only=True):
    prompt: str | list[int]
    max_tokens: Annotated[int | None, msgspec.Meta(
        description=f"most tokens to generate; null = {COMPLETION_MAX_TOKENS} (OpenAI's default for completions)")] = None
    logprobs: Annotated[TopN | None, msgspec.Meta(
        description="log-probabilities of each generated token and of its N most likely alternatives "
                    "(the model's raw distribution, before temperature and top_p); null = none")] = None


class ChatRequest(_Common, kw_only=True):
    messages: list[ChatMessage]
    max_tokens: Annotated[int | None, msgspec.Meta(
        description="most tokens to generate; null = until the context ends (OpenAI's default for chat)")] = None
    max_completion_tokens: Annotated[int | None, msgspec.Meta(
        description="OpenAI's newer name for max_tokens; wins over it when both are given")] = None
    logprobs: Annotated[bool | None, msgspec.Meta(
        description="return the log-probability of each generated token (the model's raw distribution, "
                    "before temperature and top_p)")] = None
    top_logprobs: Annotated[TopN | None, msgspec.Meta(
        description="also the N most likely alternatives of each token; needs logprobs=true")] = None


def decode_body(raw: bytes, tp: type) -> msgspec.Struct:
    try:
        return msgspec.json.decode(raw, type=tp)
    except msgspec.ValidationError as exc:
        param = _param(str(exc))
        hint = f" (one of: {', '.join(CHOICES[param])})" if param in CHOICES else ""
        raise ApiError(400, f"invalid request: {exc}{hint}", param) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"malformed JSON: {exc}") from None
    except RecursionError:  # msgspec's nesting limit (e.g. 10,000 `[` in an ignored field)
        raise ApiError(400, "malformed JSON: nested too deeply") from None


def decode_field(value: object, tp: type, where: str):
    """A part of the body whose type another field decides, as `tp`; ApiError(400) naming `where`."""
    try:
        return msgspec.convert(value, tp)
    except msgspec.ValidationError as exc:
        inner, text = _param(str(exc)), str(exc)
        text = text.replace("`$.", f"`$.{where}.") if inner else f"{text} - at `$.{where}`"
        raise ApiError(400, f"invalid request: {text}", f"{where}.{inner}" if inner else where) from None


def _param(error: str) -> str | None:
    """The field a msgspec error names: "... - at `$.a[0].b`" and/or "missing required field `c`"."""
    path = error.rsplit("`$.", 1)[-1].rstrip("`") if "`$." in error else ""
    missing = re.search(r"missing required field `([^`]+)`", error)
    if missing:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
    return path or None


def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > 8:
        raise ApiError(400, "at most 8 stop sequences", "stop")
    if any(not s for s in stops):
        raise ApiError(400, "stop sequences must be non-empty", "stop")
    return stops


def check_sampling(req: _Common, max_tokens: int | None, prompt_len: int, context: int) -> int:
    """Validate sampling against the model; returns the effective max_tokens (OpenAI's defaults)."""
    if req.n != 1:
        raise ApiError(400, "only n=1 is supported", "n")
    if req.temperature < 0:
        raise ApiError(400, f"temperature must be >= 0, got {req.temperature}", "temperature")
    if not 0 < req.top_p <= 1:
        raise ApiError(400, f"top_p must be in (0, 1], got {req.top_p}", "top_p")
    if req.seed is not None and not -(2 ** 63) <= req.seed < 2 ** 64:  # what the bus (msgpack) can carry
        raise ApiError(400, f"seed must fit in 64 bits, got {req.seed}", "seed")
    if prompt_len == 0:
        raise ApiError(400, "prompt is empty", "prompt")
    if prompt_len >= context:
        raise ApiError(400, f"prompt has {prompt_len} tokens; the model's context is {context}", "prompt")
    room = context - prompt_len
    if max_tokens is None:
        return room if isinstance(req, ChatRequest) else min(COMPLETION_MAX_TOKENS, room)
    if max_tokens <= 0:
        raise ApiError(400, f"max_tokens must be > 0, got {max_tokens}", "max_tokens")
    if max_tokens > room:
        raise ApiError(400, f"max_tokens={max_tokens} exceeds the {room} tokens left in the context "
                            f"({prompt_len} prompt tokens of {context})", "max_tokens")
    return max_tokens


def logprob_count(req: _Common) -> int | None:
    """The alternatives each generated token reports; None: no log-probabilities."""
    if isinstance(req, ChatRequest):
        if not req.logprobs:
            if req.top_logprobs is not None:
                raise ApiError(400, "top_logprobs needs logprobs=true", "top_logprobs")
            return None
        return req.top_logprobs or 0
    return getattr(req, "logprobs", None)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt: int, completion: int, cached: int, tiers: PromptTiers | None = None) -> dict:
    """OpenAI's usage object, with `dualpath_tiers` beside `cached_tokens` when an engine said."""
    details: dict = {"cached_tokens": cached}
    if tiers is not None:
        details["dualpath_tiers"] = as_dict(tiers)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": details}


def completion_body(rid: str, model: str, chat: bool, text: str, finish: FinishReason | None, use: dict | None,
                    logprobs: dict | None = None) -> dict:
    now = int(time.time())
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                  "finish_reason": finish}
        body = {"id": rid, "object": "chat.completion", "created": now, "model": model, "choices": [choice]}
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
        body = {"id": rid, "object": "text_completion", "created": now, "model": model, "choices": [choice]}
    if use is not None:
        body["usage"] = use
    return body


def chunk_body(rid: str, model: str, chat: bool, text: str, finish: FinishReason | None, first: bool,
               logprobs: dict | None = None) -> dict:
    now = int(time.time())
    if chat:
        delta = {"content": text}
        if first:
            delta["role"] = "assistant"
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {"id": rid, "object": "chat.completion.chunk", "created": now, "model": model, "choices": [choice]}
    choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
    return {"id": rid, "object": "text_completion", "created": now, "model": model, "choices": [choice]}
