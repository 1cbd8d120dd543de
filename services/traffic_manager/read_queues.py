"""How long a storage read waits at each node's gateway, and the deadlines that follow.

A read's deadline starts once the queue ahead of it drains: queued is slow, not lost."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from shared.messages.registry import StorageGatewayAnnounce


class ReadQueues:
    def __init__(self, transfer_timeout_s: float):
        self.transfer_timeout_s = transfer_timeout_s
        self.gateways: dict[str, StorageGatewayAnnounce] = {}  # node -> its storage-gateway's last announcement
        self.reading: dict[str, int] = {}  # node -> bytes asked of that node's gateway, not yet read

    def note(self, msg: StorageGatewayAnnounce) -> None:
        self.gateways[msg.node] = msg

    def read_wait(self, node: str, nbytes: int = 0) -> float:
        """Seconds a read of `nbytes` queued now at `node` waits (0 when uncapped or unknown)."""
        g = self.gateways.get(node)
        if g is None or g.read_bytes_per_s <= 0:
            return 0.0
        return (max(g.read_q_bytes, self.reading.get(node, 0)) + nbytes) / g.read_bytes_per_s

    def queue_wait(self, node: str, nbytes: int) -> float:
        """1.5x the wait of a read queued now: announcements lag a heartbeat."""
        return 1.5 * self.read_wait(node, nbytes)

    def deadline(self, node: str, nbytes: int) -> float:
        return self.transfer_timeout_s + self.queue_wait(node, nbytes)

    @contextlib.contextmanager
    def read_at(self, node: str, nbytes: int) -> Iterator[None]:
        """Count `nbytes` as outstanding at `node` for as long as the block runs."""
        self.reading[node] = self.reading.get(node, 0) + nbytes
        try:
            yield
        finally:
            self.reading[node] -= nbytes
