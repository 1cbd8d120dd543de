"""The tcp initiator's threaded bulk sender (tcp_send.py): FIFO bytes, held while latency is open."""

import asyncio
import socket

import pytest

from shared.transport.classes import LinkGate
from shared.transport.tcp_send import BulkSender
from tests.integration.pollutil import until

pytestmark = pytest.mark.integration


def drain(sock: socket.socket, got: bytearray) -> None:
    try:
        while chunk := sock.recv(1 << 20):
            got += chunk
    except BlockingIOError:
        pass


def test_bulk_frames_go_out_in_order_and_wait_while_latency_work_is_open():
    async def main() -> None:
        tx, rx = socket.socketpair()
        tx.setblocking(False)
        rx.setblocking(False)
        gate = LinkGate()
        gate.policy.max_hold = 60.0  # the liveness rule must not admit the frame during the test
        errors: list[BaseException] = []
        sender = BulkSender(tx, gate, errors.append)
        got = bytearray()
        try:
            frames = [([bytes([i]) * 7, memoryview(bytes([i + 100]) * 50_000)], 50_007) for i in range(40)]
            sender.submit_many(1, frames)
            want = b"".join(bytes(b) for bufs, _ in frames for b in bufs)
            await until(lambda: (drain(rx, got), len(got) == len(want))[1], "the idle-gate frames")
            assert bytes(got) == want

            gate.open()  # latency work opens: the next bulk frame waits for its turn
            sender.submit(1, [b"held"], 4)
            await until(lambda: gate.policy._held_since is not None, "the bulk frame to be held")
            drain(rx, got)
            assert len(got) == len(want)  # nothing of the held frame went out
            gate.close()
            await until(lambda: (drain(rx, got), bytes(got[len(want):]) == b"held")[1], "the released frame")
            assert not errors
        finally:
            sender.close()
            tx.close()
            rx.close()

    asyncio.run(main())
