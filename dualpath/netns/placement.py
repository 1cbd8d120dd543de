"""Where a mesh's processes run when hosts are network namespaces (`MeshSpec(netns=True)`).

Owns `MeshNet`: one fabric (fabric.py) with a host for NATS, one for the scheduler and
one per node (its gateway, engines and traffic managers), each node's link shaped to
the compute-NIC rate and latency the spec names (links.py). The launcher (mesh.py) asks
it where a process goes: `argv` prefixes the command with `ip netns exec`, `ip` is the
address its listeners bind and announce, `entered` binds a socket in a host's namespace.
Traffic managers on different nodes then see different `host_id`s (the network
namespace is part of it), so KV between nodes moves over real TCP at the kernel's rate.

Example: `net = MeshNet(gbps=10, latency_ms=0.5)`; `net.node("p0")` -> Host p0 at
198.18.7.3, its link 10 Gbit/s both ways, +0.5 ms on what it sends;
`net.argv("p0", [python, "-m", "services.traffic_manager", ...])`; `net.close()`.
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
