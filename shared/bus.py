"""The control-plane bus: NATS with msgspec messages and trace context in headers.

Messages are checked and decoded by their endpoint's types (shared/messages/endpoints.py). A
message that does not decode, or a handler that raises, is logged and counted, never fatal.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from opentelemetry import context as otel_context

from shared.messages.codes import ErrorCode
from shared.messages.endpoints import endpoint_of
from shared.messages.typed_subject import BusEndpoint
from shared.tracing import extract_context, inject_headers

log = logging.getLogger("bus")


def _as_str(obj: Any) -> Any:
    """msgspec encodes no str subclass: a `Subject` carried in a message goes as its text."""
    if isinstance(obj, str):
        return str(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_encoder = msgspec.msgpack.Encoder(enc_hook=_as_str)
_NO_CONTEXT = otel_context.Context()  # what extracting from no headers gives (shared: contexts are immutable)


RETRY_S = 0.25  # between connection attempts, at start-up and after a lost server
REMIND_S = 10.0  # while waiting at start-up: one "still waiting" line this often


class BusUnavailable(RuntimeError):
    """No NATS server of `url` accepted a connection within `waited_s`; `reason` is the last error."""

    def __init__(self, url: str, waited_s: float, reason: str):
        super().__init__(f"no NATS server at {url} within {waited_s:g} s (last error: {reason}); "
                         "start nats-server there, or point --nats-url at one (--nats-wait-s waits longer)")
        self.url, self.waited_s, self.reason = url, waited_s, reason


class _Waiting:
    def __init__(self, url: str, wait_s: float):
        self.url, self.wait_s = url, wait_s
        self.active, self.attempts, self.last = True, 0, ""
        self.t0 = self.reminded = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def failed(self, exc: Exception) -> None:
        self.attempts += 1
        self.last = str(exc) or type(exc).__name__
        limit = f"giving up after {self.wait_s:g} s" if self.wait_s > 0 else "waiting without limit"
        if self.attempts == 1:
            log.warning("waiting for NATS at %s (%s); retrying every %g s, %s", self.url, self.last, RETRY_S, limit)
        elif time.monotonic() - self.reminded >= REMIND_S:
            self.reminded = time.monotonic()
            log.warning("still waiting for NATS at %s after %.0f s (%s); %s", self.url, self.elapsed(), self.last,
                        limit)


async def _abandon(nc: Client) -> None:
    try:
        await asyncio.shield(nc.close())
    except BaseException:  # noqa: BLE001 - nothing to save on this path
        pass


class BusError(RuntimeError):
    """A control-plane call that failed: `subject`, `reason`, and the `code` a reply gave (None: none)."""

    def __init__(self, subject: str, reason: str, code: ErrorCode | None = None):
        super().__init__(f"{subject}: {reason}")
        self.subject, self.reason, self.code = subject, reason, code


def error_code(exc: BaseException, default: ErrorCode) -> ErrorCode:
    return exc.code if isinstance(exc, BusError) and exc.code is not None else default


@dataclass
class Delivery:
    subject: str
    reply: str
    headers: dict[str, str]
    ctx: otel_context.Context
    bus: "Bus"
    endpoint: BusEndpoint

    async def respond(self, msg: msgspec.Struct) -> None:
        """Answer a request (nothing is sent without a reply address); TypeError for a wrong reply type."""
        self.endpoint.check_reply(msg)
        if self.reply:
            await self.bus._send(self.reply, msg)


Handler = Callable[[Any, Delivery], Awaitable[None]]


class Losses:
    """A future per connection that resolves when it is lost: a request waiting for a reply races
    it, so a reply that died with the connection fails the request at once, not at its timeout."""

    def __init__(self) -> None:
        self._now: asyncio.Future | None = None
        self.on_reconnect: list[Callable[[], None]] = []  # told once the connection is back (messages may be lost)

    def current(self) -> asyncio.Future:
        if self._now is None or self._now.done():
            self._now = asyncio.get_running_loop().create_future()
        return self._now

    def lost(self) -> None:
        if self._now is not None and not self._now.done():
            self._now.set_result(None)


@dataclass
class Bus:
    nc: Client
    name: str
    bad_messages: int = 0
    handler_errors: int = 0
    losses: Losses = field(default_factory=Losses)
    _decoders: dict[Any, msgspec.msgpack.Decoder] = field(default_factory=dict)

    @classmethod
    async def connect(cls, url: str, name: str, *, wait_s: float = 60.0, **opts: Any) -> "Bus":
        """Connect, waiting up to `wait_s` s (0 = forever) for a server, else BusUnavailable. Once
        connected, a lost server is retried forever and publishes meanwhile are buffered."""
        nc = Client()
        waiting = _Waiting(url, wait_s)
        losses = Losses()

        async def on_error(exc: Exception) -> None:
            if not nc.is_connected and waiting.active:
                waiting.failed(exc)  # the initial connect: say what we wait for, not each refusal
            elif isinstance(exc, OSError):  # refused/reset while the server is away: one line, no traceback
                log.debug("nats: %s", exc)
            else:
                log.warning("nats: %s: %s", type(exc).__name__, exc)

        async def on_disconnected() -> None:
            losses.lost()
            if not nc.is_closed and not waiting.active:  # a close (shutdown) also calls this
                log.warning("disconnected from NATS; reconnecting")

        async def on_reconnected() -> None:
            for hook in losses.on_reconnect:
                hook()
            log.info("reconnected to NATS at %s", nc.connected_url.netloc if nc.connected_url else "?")

        opts.setdefault("error_cb", on_error)
        opts.setdefault("disconnected_cb", on_disconnected)
        opts.setdefault("reconnected_cb", on_reconnected)
        connecting = nc.connect(servers=url.split(","), name=name, max_reconnect_attempts=-1,
                                reconnect_time_wait=RETRY_S, connect_timeout=opts.pop("connect_timeout", 5), **opts)
        try:
            await asyncio.wait_for(connecting, wait_s if wait_s > 0 else None)
        except asyncio.TimeoutError:
            await _abandon(nc)
            raise BusUnavailable(url, wait_s, waiting.last or "no answer") from None
        except BaseException:  # cancelled (the service was stopped while waiting), or a bad option
            await _abandon(nc)
            raise
        finally:
            waiting.active = False
        if waiting.attempts:
            log.info("connected to NATS at %s after %.1f s", url, waiting.elapsed())
        return cls(nc=nc, name=name, losses=losses)

    def decoder(self, tp: Any) -> msgspec.msgpack.Decoder:
        dec = self._decoders.get(tp)
        if dec is None:
            dec = self._decoders[tp] = msgspec.msgpack.Decoder(tp)
        return dec

    async def publish(self, subject: str, msg: msgspec.Struct, ctx: otel_context.Context | None = None) -> None:
        """TypeError when `subject`'s endpoint carries another type, ValueError when it is no subject."""
        endpoint_of(subject).check(msg, subject)
        await self._send(subject, msg, ctx)

    async def _send(self, subject: str, msg: Any, ctx: otel_context.Context | None = None) -> None:
        # no trace context: a plain PUB (an empty header block would still be sent and parsed on every delivery)
        await self.nc.publish(subject, _encoder.encode(msg), headers=inject_headers(ctx=ctx) or None)

    async def request(self, subject: str, msg: msgspec.Struct, timeout: float = 5.0,
                      ctx: otel_context.Context | None = None, abort: asyncio.Future | None = None) -> Any:
        """The reply, decoded as the endpoint's reply type. Fails at once when the connection is lost
        or `abort` resolves (the responder is known gone), else after `timeout` s."""
        ep = endpoint_of(subject)
        ep.check(msg, subject)
        if ep.reply is None:
            raise TypeError(f"endpoint {ep.name} ({subject}) takes no requests: publish on it")
        lost = self.losses.current()
        asked = asyncio.ensure_future(self.nc.request(subject, _encoder.encode(msg), timeout=timeout,
                                                      headers=inject_headers(ctx=ctx) or None))
        try:
            await asyncio.wait([asked, lost] + ([abort] if abort is not None else []),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not asked.done():
                asked.cancel()
        if not asked.done() or asked.cancelled():
            raise BusError(subject, "the responder went away before its reply" if abort is not None and abort.done()
                           else "the connection to NATS was lost before the reply")
        try:
            reply = asked.result()
        except nats.errors.NoRespondersError:
            raise BusError(subject, "no responders") from None
        except nats.errors.TimeoutError:
            raise BusError(subject, f"no reply within {timeout}s") from None
        try:
            return self.decoder(ep.reply).decode(reply.data)
        except msgspec.DecodeError as exc:
            raise BusError(subject, f"bad reply: {exc}") from None

    async def subscribe(self, subject: str, handler: Handler, queue: str = ""):
        ep = endpoint_of(subject)
        dec = self.decoder(ep.msg)

        async def on_msg(m: Msg) -> None:
            try:
                msg = dec.decode(m.data)
            except msgspec.DecodeError as exc:
                self.bad_messages += 1
                log.warning("dropped bad message on %s: %s", m.subject, exc)
                return
            headers = dict(m.headers) if m.headers else {}
            delivery = Delivery(m.subject, m.reply, headers, extract_context(headers) if headers else _NO_CONTEXT, self,
                                ep)
            try:
                await handler(msg, delivery)
            except Exception:  # noqa: BLE001 - a handler bug must not kill the loop
                self.handler_errors += 1
                log.exception("handler for %s failed", m.subject)

        return await self.nc.subscribe(subject, queue=queue, cb=on_msg)

    async def close(self) -> None:
        if self.nc.is_connected:
            try:
                await self.nc.drain()
            except Exception:  # noqa: BLE001
                await self.nc.close()
        elif not self.nc.is_closed:
            await self.nc.close()
