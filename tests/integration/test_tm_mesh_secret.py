"""Traffic managers of one mesh agree on a data-plane secret over the bus (secret.py).

Real nats-server with JetStream: the first caller creates the mesh's secret, every later
caller of the same namespace reads the same one, another namespace (another mesh) gets
its own, a set secret wins, and without JetStream the answer is None (the process's own).
"""
import asyncio
import uuid

import nats
import pytest

from services.traffic_manager.secret import mesh_secret
from tests.integration.natsutil import NatsServer

pytestmark = pytest.mark.integration


async def _secrets(url: str, calls: list[tuple[str, str]]) -> list[str | None]:
    out = []
    for namespace, setting in calls:
        nc = await nats.connect(url)
        try:
            out.append(await mesh_secret(nc, namespace, setting))
        finally:
            await nc.close()
    return out


def test_one_mesh_shares_one_secret_and_another_mesh_has_its_own(tmp_path):
    server = NatsServer(tmp_path, jetstream=True).start()
    try:
        a, b = "dp" + uuid.uuid4().hex[:8], "dp" + uuid.uuid4().hex[:8]
        first, again, other, given = asyncio.run(_secrets(server.url, [(a, ""), (a, ""), (b, ""), (a, "s3cret")]))
        assert first and len(first) == 64
        assert again == first
        assert other and other != first
        assert given == "s3cret"
    finally:
        server.stop()


def test_without_jetstream_a_tm_keeps_its_process_secret(tmp_path):
    server = NatsServer(tmp_path, jetstream=False, log="nats-nojs.log").start()
    try:
        assert asyncio.run(_secrets(server.url, [("dp" + uuid.uuid4().hex[:8], "")])) == [None]
    finally:
        server.stop()
