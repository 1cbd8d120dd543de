"""The tcp server's latency sockets: bulk of the endpoint waits from the moment a latency frame
arrives (tcp_server.ReadySock), not from when its coroutine gets a loop turn, until it is served."""

import asyncio
import socket

import pytest

from shared.transport.base import TrafficClass
from shared.transport.classes import DEFAULT_WEIGHTS, LinkGate
from shared.transport.grants import GrantTable
from shared.transport.tcp_server import ServerConn
from shared.transport.tcp_wire import HEADER, HLEN, Kind, header
from tests.integration.pollutil import until

pytestmark = pytest.mark.integration


def test_a_latency_frame_holds_bulk_from_its_arrival_until_it_is_served():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        lsock = socket.create_server(("127.0.0.1", 0))
        cli = socket.create_connection(lsock.getsockname())
        srv, _ = lsock.accept()
        lsock.close()
        cli.setblocking(False)
        gate = LinkGate()
        gate.policy.max_hold = 60.0
        conn = ServerConn(srv, GrantTable(), DEFAULT_WEIGHTS, gate)
        busy_at_frame: list[bool] = []
        real = conn._frame

        async def frame(*h: int) -> None:
            busy_at_frame.append(gate.policy.busy)  # what a bulk batch about to move would see
            await real(*h)

        conn._frame = frame  # type: ignore[method-assign]

        async def ask(req: int) -> None:
            """A latency READ under a handle never granted: served all the same, with an ERR."""
            await loop.sock_sendall(cli, header(Kind.READ, TrafficClass.LATENCY, 0, req, 1, 0, 0, 16))
            got = b""
            while len(got) < HLEN:
                got += await loop.sock_recv(cli, HLEN - len(got))
            kind, *_, n = HEADER.unpack(got)
            assert kind == Kind.ERR
            while n:
                n -= len(await loop.sock_recv(cli, n))

        try:
            await ask(1)  # the first frame tells the server this is a latency socket
            await ask(2)
            await until(lambda: not gate.policy.busy, "the gate to close once the frame is served")
            assert busy_at_frame == [False, True]
        finally:
            await conn.close()
            cli.close()

    asyncio.run(main())
