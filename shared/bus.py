"""The control-plane bus: NATS with msgspec messages and trace context in headers.

Owns the connection of one process. Handlers get the decoded message and a
`Delivery` (trace context, reply). A message that does not decode is logged,
counted in `bad_messages` and dropped; a handler that raises is logged and
counted in `handler_errors` -- neither ever stops a subscription loop.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, TypeVar

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from opentelemetry import context as otel_context

from shared.tracing import extract_context, inject_headers

log = logging.getLogger("bus")
T = TypeVar("T")
_encoder = msgspec.msgpack.Encoder()


class BusError(RuntimeError):
    """A control-plane call that failed: `subject` it went to and `reason`."""

    def __init__(self, subject: str, reason: str):
        super().__init__(f"{subject}: {reason}")
        self.subject, self.reason = subject, reason


@dataclass
class Delivery:
    subject: str
    reply: str
    headers: dict[str, str]
    ctx: otel_context.Context
    bus: "Bus"

    async def respond(self, msg: msgspec.Struct) -> None:
        if self.reply:
            await self.bus.publish(self.reply, msg)


Handler = Callable[[Any, Delivery], Awaitable[None]]


@dataclass
class Bus:
    nc: Client
    name: str
    bad_messages: int = 0
    handler_errors: int = 0
    _decoders: dict[Any, msgspec.msgpack.Decoder] = field(default_factory=dict)

    @classmethod
    async def connect(cls, url: str, name: str, **opts: Any) -> "Bus":
        """Connect; on a lost server, retry forever every 0.25 s. Subscriptions are restored by
        nats-py on reconnect and publishes made meanwhile are buffered and sent then."""
        nc: Client | None = None

        async def on_error(exc: Exception) -> None:
            if isinstance(exc, OSError):  # refused/reset while the server is away: one line, no traceback
                log.debug("nats: %s", exc)
            else:
                log.warning("nats: %s: %s", type(exc).__name__, exc)

        async def on_disconnected() -> None:
            if nc is not None and not nc.is_closed:  # a close (shutdown) also calls this
                log.warning("disconnected from NATS; reconnecting")

        async def on_reconnected() -> None:
            log.info("reconnected to NATS at %s", nc.connected_url.netloc if nc and nc.connected_url else "?")

        opts.setdefault("error_cb", on_error)
        opts.setdefault("disconnected_cb", on_disconnected)
        opts.setdefault("reconnected_cb", on_reconnected)
        nc = await nats.connect(
            servers=url.split(","),
            name=name,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.25,
            connect_timeout=opts.pop("connect_timeout", 5),
            **opts,
        )
        return cls(nc=nc, name=name)

    def decoder(self, tp: Any) -> msgspec.msgpack.Decoder:
        dec = self._decoders.get(tp)
        if dec is None:
            dec = self._decoders[tp] = msgspec.msgpack.Decoder(tp)
        return dec

    async def publish(self, subject: str, msg: msgspec.Struct, ctx: otel_context.Context | None = None) -> None:
        await self.nc.publish(subject, _encoder.encode(msg), headers=inject_headers(ctx=ctx))

    async def request(self, subject: str, msg: msgspec.Struct, reply_type: type[T], timeout: float = 5.0,
                      ctx: otel_context.Context | None = None) -> T:
        try:
            reply = await self.nc.request(subject, _encoder.encode(msg), timeout=timeout,
                                          headers=inject_headers(ctx=ctx))
        except nats.errors.NoRespondersError:
            raise BusError(subject, "no responders") from None
        except nats.errors.TimeoutError:
            raise BusError(subject, f"no reply within {timeout}s") from None
        try:
            return self.decoder(reply_type).decode(reply.data)
        except msgspec.DecodeError as exc:
            raise BusError(subject, f"bad reply: {exc}") from None

    async def subscribe(self, subject: str, tp: Any, handler: Handler, queue: str = ""):
        dec = self.decoder(tp)

        async def on_msg(m: Msg) -> None:
            try:
                msg = dec.decode(m.data)
            except msgspec.DecodeError as exc:
                self.bad_messages += 1
                log.warning("dropped bad message on %s: %s", m.subject, exc)
                return
            headers = dict(m.headers or {})
            delivery = Delivery(m.subject, m.reply, headers, extract_context(headers), self)
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
