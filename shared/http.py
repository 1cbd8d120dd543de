"""A uvicorn server on a pre-bound socket, so port 0 works and the real port is known."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import socket

import uvicorn


class PortInUse(OSError):
    """`host:port` already has a listener; `setting` names what picks another port (e.g. `http_port`)."""

    def __init__(self, host: str, port: int, setting: str = ""):
        hint = f"; pick another with --{setting.replace('_', '-')}" if setting else ""
        super().__init__(errno.EADDRINUSE, f"port {port} on {host} is in use{hint}")
        self.host, self.port, self.setting = host, port, setting

    def __str__(self) -> str:
        return self.strerror


def bind_socket(host: str, port: int, setting: str = "") -> socket.socket:
    """A listening socket on host:port (0 = any free port); PortInUse when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers only, never a live listener
        sock.bind((host, port))
        sock.listen(512)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(host, port, setting) from None
        raise
    sock.set_inheritable(True)
    return sock


def adopt_socket(fd: int) -> socket.socket:
    """The listening socket inherited as file descriptor `fd` (bound by a parent process)."""
    sock = socket.socket(fileno=fd)
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) != 1:
        sock.detach()
        raise OSError(errno.EINVAL, f"file descriptor {fd} is not a listening socket")
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server ticking once a second, not ten times; `stop()` wakes it at once."""

    TICK_S = 1.0

    async def main_loop(self) -> None:
        self.woken = asyncio.Event()
        counter = 0
        while not await self.on_tick(counter):  # every tick is a whole second: a multiple of uvicorn's 10
            counter = (counter + 10) % 864000
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.woken.wait(), self.TICK_S)

    def wake(self) -> None:
        woken = getattr(self, "woken", None)
        if woken is not None:
            woken.set()


class HttpServer:
    """Serves an ASGI app on `host:port`, or on `sock` (already listening); `url` is known at once."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, *, sock: socket.socket | None = None,
                 setting: str = "", limit_concurrency: int | None = None):
        self.sock = sock if sock is not None else bind_socket(host, port, setting)
        self.host, self.port = self.sock.getsockname()[:2]
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False,
                                limit_concurrency=limit_concurrency, timeout_graceful_shutdown=2)
        self.server = _Server(config)
        # the service owns SIGTERM/SIGINT: older uvicorn installs handlers, newer ones take the signals over
        # while serving and raise them again when done (a second "stop" at the end of every shutdown)
        self.server.install_signal_handlers = lambda: None
        self.server.capture_signals = contextlib.nullcontext

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def serve(self) -> None:
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            self.sock.close()

    def stop(self) -> None:
        self.server.should_exit = True
        self.server.wake()

    def close(self) -> None:
        self.sock.close()
