"""The OpenAPI 3.1 description of the front door, served at `GET /openapi.json`.

Request schemas come from the msgspec Structs in `protocol`, so the description cannot drift."""
from __future__ import annotations

from functools import lru_cache

import msgspec

from services.scheduler.hint_shapes import CloseSession, OpenSession
from services.scheduler.protocol import ChatRequest, CompletionRequest

REF = "#/components/schemas/{name}"

ERROR_SCHEMA = {
    "title": "Error",
    "type": "object",
    "properties": {"error": {
        "type": "object",
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string"},  # invalid_request_error | authentication_error | ...
            "param": {"anyOf": [{"type": "string"}, {"type": "null"}]},  # the offending field, when known
            "code": {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]},
        },
        "required": ["message", "type", "param", "code"],
    }},
    "required": ["error"],
}


_NUM = {"type": "number"}
_BYTES = {"type": "array", "items": {"type": "integer"}}  # the token's UTF-8 bytes

COMPLETION_LOGPROBS = {
    "title": "CompletionLogprobs",
    "description": "one entry per reported token (its text is at least partly in this choice's or chunk's text); "
                   "log_softmax of the raw logits, before temperature and top_p",
    "type": "object",
    "properties": {
        "tokens": {"type": "array", "items": {"type": "string"}},
        "token_logprobs": {"type": "array", "items": _NUM},
        "top_logprobs": {"type": "array", "items": {"type": "object", "additionalProperties": _NUM},
                         "description": "the `logprobs` most likely tokens (text -> logprob); empty when 0"},
        "text_offset": {"type": "array", "items": {"type": "integer"},
                        "description": "where each token's text starts in the completion text (characters)"},
    },
    "required": ["tokens", "token_logprobs", "top_logprobs", "text_offset"],
}

_CHAT_TOKEN = {"token": {"type": "string"}, "logprob": _NUM, "bytes": _BYTES}
CHAT_LOGPROBS = {
    "title": "ChatLogprobs",
    "description": "one entry per reported token; log_softmax of the raw logits, before temperature and top_p",
    "type": "object",
    "properties": {"content": {"type": "array", "items": {
        "type": "object",
        "properties": {**_CHAT_TOKEN, "top_logprobs": {"type": "array", "items": {
            "type": "object", "properties": _CHAT_TOKEN, "required": list(_CHAT_TOKEN)}}},
        "required": [*_CHAT_TOKEN, "top_logprobs"],
    }}},
    "required": ["content"],
}


def _ref(name: str) -> dict:
    return {"$ref": REF.format(name=name)}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict:
    text = {400: "invalid request", 401: "missing or invalid API key", 404: "model not served",
            413: "body too large", 500: "engine error", 503: "no engine available"}
    return {str(c): _json(_ref("Error"), text[c]) for c in codes}


def _generate(body: str, summary: str, logprobs: str) -> dict:
    lp = {"anyOf": [_ref(logprobs), {"type": "null"}], "description": "null unless log-probabilities were asked for"}
    choice = {"type": "object", "properties": {"logprobs": lp}}
    answer = {"type": "object", "properties": {"choices": {"type": "array", "items": choice}}}
    ok = {"description": "a completion (JSON), or server-sent events ending in `data: [DONE]` when stream=true "
                         "(each chunk's choice has the same `logprobs` field, for the tokens it reports)",
          "content": {"application/json": {"schema": answer},
                      "text/event-stream": {"schema": {"type": "string"}}}}
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(body)}}},
        "responses": {"200": ok, **_errors(400, 401, 404, 413, 500, 503)},
    }}


def _session(body: str, summary: str, answer: dict) -> dict:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": body == "CloseSession", "content": {"application/json": {"schema": _ref(body)}}},
        "responses": {"200": answer, **_errors(400, 401, 413)},
    }}


def _get(summary: str, *errors: int, open_: bool = False) -> dict:
    op = {"summary": summary, "responses": {"200": _json({"type": "object"}, "ok"), **_errors(*errors)}}
    if open_:
        op["security"] = []  # no API key needed
    return {"get": op}


@lru_cache(maxsize=1)
def openapi_document() -> dict:
    """The whole document, built once."""
    _, components = msgspec.json.schema_components((CompletionRequest, ChatRequest, OpenSession, CloseSession),
                                                   ref_template=REF)
    components["Error"] = ERROR_SCHEMA
    components["CompletionLogprobs"] = COMPLETION_LOGPROBS
    components["ChatLogprobs"] = CHAT_LOGPROBS
    return {
        "openapi": "3.1.0",
        "info": {"title": "dualpath", "version": "1",
                 "description": "OpenAI-style completions served by a PD-disaggregated mesh."},
        "paths": {
            "/v1/models": _get("the served model", 401),
            "/v1/completions": _generate("CompletionRequest", "complete a prompt (text or token ids)",
                                         "CompletionLogprobs"),
            "/v1/chat/completions": _generate("ChatRequest", "complete a chat", "ChatLogprobs"),
            "/health": _get("live prefill/decode engines (503 when either is missing)", 503, open_=True),
            "/v1/mesh": _get("the live mesh as the scheduler sees it", 401),
            "/open_session": _session("OpenSession", "open an agent session (SGLang's API): its id",
                                      _json({"type": "string"}, "the session's id")),
            "/close_session": _session("CloseSession", "close an agent session (SGLang's API): its retained and "
                                       "staged KV is let go", {"description": "closed (empty body)"}),
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],  # only enforced when the scheduler has API keys configured
    }
