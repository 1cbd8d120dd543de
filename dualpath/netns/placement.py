"""Where a mesh's processes run when hosts are network namespaces (`MeshSpec(netns=True)`).

`MeshNet`: one fabric with a host for NATS, one for the scheduler and one per node, each link
shaped to the spec's rate and latency; the launcher asks it for `argv`, `ip` and `entered`.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from dualpath.netns.fabric import Fabric, Host
from dualpath.netns.links import Links
from dualpath.netns.nsenter import entered, exec_argv

NATS, SCHED = "nats", "sched"


class MeshNet:
    def __init__(self, gbps: float = 0.0, latency_ms: float = 0.0) -> None:
        self.gbps, self.latency_ms = gbps, latency_ms
        self.fabric = Fabric()
        try:
            self.links = Links(self.fabric)
            self.fabric.add_host(NATS)
            self.fabric.add_host(SCHED)
        except BaseException:
            self.fabric.close()
            raise

    def host(self, where: str) -> Host:
        """The host `where` names ("nats", "sched" or a node), made and shaped on first use."""
        h = self.fabric.hosts.get(where)
        if h is None:
            h = self.fabric.add_host(where)
            self.links.shape(h, self.gbps, self.latency_ms)
        return h

    def ip(self, where: str) -> str:
        return self.host(where).ip

    def argv(self, where: str, argv: list[str]) -> list[str]:
        return exec_argv(self.host(where).ns, argv)

    @contextlib.contextmanager
    def entered(self, where: str) -> Iterator[None]:
        with entered(self.host(where).ns):
            yield

    def close(self) -> None:
        self.fabric.close()
