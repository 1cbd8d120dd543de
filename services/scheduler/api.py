"""HTTP handlers of the front door: the OpenAI-style endpoints, /health, /v1/mesh, /metrics, /openapi.json.

A client that leaves cancels its request everywhere, so both engines free its KV."""
from __future__ import annotations

import asyncio
import functools
import json
import time
from typing import AsyncIterator, Callable

from opentelemetry import trace
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from services.scheduler.auth import ApiKeyMiddleware
from services.scheduler.front import Front
from services.scheduler.hint_dialects import request_hint
from services.scheduler.inflight import InFlight
from services.scheduler.logprobs import LogprobTrack, Reported, logprobs_body
from services.scheduler.openapi import openapi_document
from services.scheduler.sessions_api import session_routes
from services.scheduler.protocol import (ApiError, ChatRequest, CompletionRequest, StreamOptions, check_sampling,
                                         chunk_body, completion_body, decode_body, failure, logprob_count, new_id,
                                         stop_list, usage)
from services.scheduler.stops import StopMatcher
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.work import Sampling
from shared.model.token_text import TokenText

tracer = trace.get_tracer("scheduler")
# (text delta, finish reason or None, the failure when it failed, logprobs it reports)
Event = tuple[str, FinishReason | None, ApiError | None, list[Reported]]


def build_app(svc: Front) -> Starlette:
    texts = TokenText(svc.tokenizer)  # how tokens read in log-probabilities (cached per id)

    async def models(request: Request) -> Response:
        mid = svc.model_id()
        data = [{"id": mid, "object": "model", "created": 0, "owned_by": "dualpath"}] if mid else []
        return JSONResponse({"object": "list", "data": data})

    async def health(request: Request) -> Response:
        ok, body = await svc.health()
        return JSONResponse(body, status_code=200 if ok else 503)

    async def mesh(request: Request) -> Response:
        return JSONResponse(await svc.mesh())

    async def completions(request: Request) -> Response:
        return await _handle(svc, request, texts, chat=False)

    async def chat(request: Request) -> Response:
        return await _handle(svc, request, texts, chat=True)

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/v1/mesh", mesh, methods=["GET"]),
        Route("/metrics", svc.metrics_endpoint, methods=["GET"]),
        Route("/openapi.json", lambda request: JSONResponse(openapi_document()), methods=["GET"]),
        *session_routes(svc, _read_body),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(ApiKeyMiddleware, keys=svc.cfg.api_keys)])
    app.add_exception_handler(ApiError, lambda req, exc: JSONResponse(exc.body(), status_code=exc.status))
    app.add_exception_handler(404, lambda req, exc: _error(404, f"no route {req.url.path}"))
    app.add_exception_handler(405, lambda req, exc: _error(405, f"method {req.method} not allowed"))
    return app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(ApiError(status, message).body(), status_code=status)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"body of {declared} bytes exceeds the {limit}-byte limit")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"body exceeds the {limit}-byte limit")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(400, "client disconnected while sending the body") from None
    return b"".join(chunks)


def _prepare(svc: Front, body: bytes, chat: bool):
    req = decode_body(body, ChatRequest if chat else CompletionRequest)
    mid = svc.model_id()
    if not mid:
        raise failure(ErrorCode.NO_ENGINE, "no engine has announced a model yet")
    if not svc.accepts_model(req.model):
        raise ApiError(404, f"model {req.model!r} is not served here (serving {mid!r})", "model", "model_not_found")
    if chat:
        if not req.messages:
            raise ApiError(400, "messages is empty", "messages")
        text = svc.tokenizer.apply_chat_template([{"role": m.role, "content": m.content} for m in req.messages])
        prompt = svc.tokenizer.encode(text)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    else:
        if isinstance(req.prompt, str):
            prompt = svc.tokenizer.encode(req.prompt) if req.prompt else []
        else:
            prompt = req.prompt  # decoded for this request alone: no copy needed
            vocab = svc.tokenizer.vocab_size  # a call into the tokenizer: once, not once per token
            if prompt and (min(prompt) < 0 or max(prompt) >= vocab):  # C loops; the slow scan only on an error
                bad = next(t for t in prompt if not 0 <= t < vocab)
                raise ApiError(400, f"token id {bad} outside the vocabulary (0..{vocab - 1})", "prompt")
        max_tokens = req.max_tokens
    max_tokens = check_sampling(req, max_tokens, len(prompt), svc.max_context())
    hint = request_hint(req)  # in any dialect; a bad hint is a 400 before anything is queued
    stops = stop_list(req.stop)
    sampling = Sampling(temperature=req.temperature, top_p=req.top_p, seed=req.seed, max_tokens=max_tokens,
                        ignore_eos=req.ignore_eos, logprobs=logprob_count(req))
    return req, prompt, sampling, stops, mid, hint


async def _handle(svc: Front, request: Request, texts: TokenText, chat: bool) -> Response:
    arrived = time.monotonic()  # before the body is read: TTFT and the assignment wait count it
    body = await _read_body(request, svc.cfg.max_body_bytes)
    req, prompt, sampling, stops, mid, hint = _prepare(svc, body, chat)
    rid = new_id("chatcmpl" if chat else "cmpl")
    span = tracer.start_span("POST " + request.url.path, attributes={
        "req_id": rid, "prompt_tokens": len(prompt), "max_tokens": sampling.max_tokens, "stream": req.stream,
        "agent_session": hint.session if hint else "", "agent_hinted": hint is not None})
    rec = InFlight(rid, prompt, sampling, ctx=trace.set_span_in_context(span),
                   mode=req.dualpath_mode or svc.cfg.mode, arrived=arrived, queued_at=arrived, hint=hint)
    await svc.admit(rec)
    events = _events(svc, rec, stops, span)
    show = None if sampling.logprobs is None else functools.partial(logprobs_body, text=texts, chat=chat)
    if req.stream:
        final = _usage_chunk(req.stream_options, rec, rid, mid, chat, req.return_token_ids)
        return StreamingResponse(_sse(events, rid, mid, chat, final, show), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Request-Id": rid})
    try:
        text, finish, failed, reported = await _collect(events, request)
    except ClientLeft:
        return Response(status_code=499)  # nobody reads it: the request is cancelled everywhere
    if failed is not None:
        return JSONResponse(failed.body(), status_code=failed.status)
    use = usage(len(prompt), rec.next_index, rec.cached_tokens, rec.tiers)
    body = completion_body(rid, mid, chat, "".join(text), finish, use, show(reported) if show else None)
    if req.return_token_ids:
        body["choices"][0].update(prompt_token_ids=prompt, token_ids=rec.tokens)
    return JSONResponse(body)


class ClientLeft(Exception):
    """The client of a non-streamed request disconnected before its answer."""


async def _collect(events: AsyncIterator[Event], request: Request):
    """(texts, finish, failure, logprobs) of a non-streamed request; ClientLeft (and cancelled) if its
    client left."""
    async def read():
        text, finish, failed, reported = [], None, None, []
        async for delta, fin, err, lps in events:
            text.append(delta)
            reported += lps
            finish, failed = fin or finish, err or failed
        return text, finish, failed, reported

    reading, gone = asyncio.ensure_future(read()), asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((reading, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        reading.cancel()  # a no-op once it is done; else its events' clean-up cancels the request
    try:
        return await reading
    except asyncio.CancelledError:
        raise ClientLeft() from None


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (its body is read: the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _events(svc: Front, rec: InFlight, stops: list[str], span) -> AsyncIterator[Event]:
    """(text delta, finish, failure, logprobs) per engine event; cancels the request if abandoned."""
    from shared.model.tokenizer import IncrementalDecoder

    decoder = IncrementalDecoder(svc.tokenizer)
    matcher = StopMatcher(stops)
    track = LogprobTrack() if rec.sampling.logprobs is not None else None
    emitted = 0  # characters handed to the client so far
    status = "cancelled"
    try:
        while True:
            ev = await rec.events.get()
            if track is None:
                delta = decoder.push(ev.tokens) if ev.tokens else ""
            else:
                delta = track.push(decoder, ev.tokens, ev.logprobs)
            if ev.finish and ev.finish != FinishReason.ERROR:
                delta += decoder.finish() if track is None else track.finish(decoder)
            delta, hit = matcher.feed(delta, final=bool(ev.finish))
            emitted += len(delta)
            lps = track.release(emitted, stopped=hit) if track is not None else []
            if hit:
                status = "ok"
                svc.cancel(rec, "stop sequence")
                yield delta, FinishReason.STOP, None, lps
                return
            if ev.finish:
                failed = failure(ev.code, ev.error) if ev.finish == FinishReason.ERROR else None
                status = "error" if failed else "ok"
                if failed:
                    span.set_attributes({"error": ev.error, "error_code": failed.code})
                yield delta, ev.finish, failed, lps
                return
            if delta or lps:
                yield delta, None, None, lps
    finally:  # no await here: a cancelled handler (the client left) is cancelled again at each await
        span.set_attribute("completion_tokens", rec.next_index)
        span.set_attribute("cached_tokens", rec.cached_tokens)
        span.end()
        if status == "cancelled":
            svc.cancel(rec, "client disconnected")
        svc.finish(rec, status)


def _usage_chunk(opts: StreamOptions | None, rec: InFlight, rid: str, mid: str, chat: bool, token_ids: bool):
    """With `stream_options.include_usage`: a callable making the last chunk, with the usage."""
    if opts is None or not opts.include_usage:
        return None

    def make() -> dict:
        chunk = {**chunk_body(rid, mid, chat, "", None, False), "choices": [],
                 "usage": usage(len(rec.prompt), rec.next_index, rec.cached_tokens, rec.tiers)}
        if token_ids:
            chunk["token_ids"] = list(rec.tokens)
        return chunk
    return make


async def _sse(events: AsyncIterator[Event], rid: str, mid: str, chat: bool, final=None,
               show: Callable[[list[Reported]], dict] | None = None) -> AsyncIterator[str]:
    """Server-sent events; with `show`, each chunk carries the logprobs of the tokens it reports."""
    first = True
    try:
        async for delta, finish, failed, lps in events:
            if failed is not None:
                yield f"data: {json.dumps(failed.body())}\n\n"
                break
            chunk = chunk_body(rid, mid, chat, delta, finish, first, show(lps) if show else None)
            yield f"data: {json.dumps(chunk)}\n\n"
            first = False
        else:
            if final is not None:
                yield f"data: {json.dumps(final())}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        await events.aclose()
