"""The tests' own nats-server: it binds a port nobody can take first, and restarts in place."""
from __future__ import annotations

import asyncio
import socket

import nats
import pytest

from tests.integration.natsutil import NatsServer, NatsStartError

pytestmark = pytest.mark.integration


async def _round_trip(url: str) -> bytes:
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        sub = await nc.subscribe("ping")
        await nc.publish("ping", b"pong")
        return (await sub.next_msg(timeout=10)).data
    finally:
        await nc.close()


def test_servers_started_at_once_each_report_the_port_they_listen_on(tmp_path):
    servers = [NatsServer(tmp_path, log=f"nats{i}.log") for i in range(3)]
    try:
        for s in servers:
            s.start()
        assert len({s.port for s in servers}) == 3 and all(s.port > 0 for s in servers)
        for s in servers:
            assert asyncio.run(_round_trip(s.url)) == b"pong"
            assert f"127.0.0.1:{s.port}" in s.log.read_text()  # the server's own word on its port
    finally:
        for s in servers:
            s.stop()


def test_a_restart_takes_the_same_port_again(tmp_path):
    server = NatsServer(tmp_path).start()
    try:
        url = server.url
        server.kill()
        server.start()
        assert server.url == url
        assert asyncio.run(_round_trip(url)) == b"pong"
    finally:
        server.stop()


def test_a_restart_whose_port_was_taken_retries_then_names_the_port(tmp_path):
    server = NatsServer(tmp_path).start()
    try:
        port = server.port
        server.kill()
        with socket.socket() as squatter:  # another process took the port meanwhile
            squatter.bind(("127.0.0.1", port))
            squatter.listen()
            with pytest.raises(NatsStartError) as info:
                server.start(attempts=2)
            assert info.value.port == port and "address already in use" in info.value.tail
            assert server.log.read_text().count("address already in use") == 2  # one per attempt
        server.start()  # the port is free again: the same URL serves
        assert server.port == port
        assert asyncio.run(_round_trip(server.url)) == b"pong"
    finally:
        server.stop()


def test_the_url_of_a_server_never_started_is_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="not started"):
        NatsServer(tmp_path).url
