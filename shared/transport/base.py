"""The data-plane contract: descriptors, traffic classes, ops, Endpoint and Peer."""

from __future__ import annotations

import abc
import enum
import os
import socket
from collections.abc import Iterable

import msgspec

from .grants import Grant


class TrafficClass(enum.IntEnum):
    LATENCY = 0  # layer blocks on the critical path of a running prefill
    BULK = 1  # storage prefetch for queued work, persistence of decoded blocks


class Op(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One contiguous copy: local -> remote for write and copy_local, remote -> local for read."""

    local_region: str
    local_offset: int
    remote_region: str
    remote_offset: int
    length: int


def coalesce(ops: list[Op]) -> list[Op]:
    """Merge runs of ops that continue each other on both sides into one op each, in order."""
    out: list[Op] = []
    if not ops:
        return out
    run = ops[0]  # the run being merged: one Op is made per merged run, not per merge
    n = run.length
    for op in ops[1:]:
        if (op.local_region == run.local_region and op.remote_region == run.remote_region
                and op.local_offset == run.local_offset + n and op.remote_offset == run.remote_offset + n):
            n += op.length
            continue
        out.append(run if n == run.length else Op(run.local_region, run.local_offset, run.remote_region,
                                                   run.remote_offset, n))
        run, n = op, op.length
    out.append(run if n == run.length else Op(run.local_region, run.local_offset, run.remote_region,
                                               run.remote_offset, n))
    return out


class RegionDesc(msgspec.Struct, omit_defaults=True, frozen=True):
    name: str
    size: int
    rid: int = 0  # small wire id (tcp header field), unique per endpoint
    shm: str = ""  # POSIX shm segment name when the region lives in /dev/shm
    addr: int = 0  # verbs: virtual address the MR was registered at
    rkey: int = 0  # verbs: remote key of the MR


class EndpointDesc(msgspec.Struct, omit_defaults=True):
    backend: str  # "shm" | "tcp" | "verbs"
    node: str  # the TM's logical id (topology name), for errors and logs
    host_id: str  # same value <=> same host and same /dev/shm (shm fast path allowed)
    pid: int = 0  # owner process, for shm liveness checks
    host: str = ""
    port: int = 0
    regions: list[RegionDesc] = []
    alive: str = ""  # shm: liveness segment name (byte 0 is 1 while the endpoint is open)
    gid: str = ""  # verbs: port GID (hex), RoCE / global routing
    lid: int = 0  # verbs: port LID (InfiniBand)
    sl: dict[int, int] = {}  # verbs: TrafficClass -> service level of that class's QP

    def region(self, name: str) -> RegionDesc | None:
        for r in self.regions:
            if r.name == name:
                return r
        return None


def same_process(a: EndpointDesc, b: EndpointDesc) -> bool:
    """Whether two announcements are one endpoint's life; a peer of a restarted one must reconnect."""
    return (a.backend, a.host_id, a.pid, a.host, a.port, a.alive, a.gid, a.lid) == \
        (b.backend, b.host_id, b.pid, b.host, b.port, b.alive, b.gid, b.lid)


def host_id() -> str:
    """This host, its /dev/shm mount and network namespace: equal ids can share segments."""
    boot = ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        pass
    try:
        dev = os.stat("/dev/shm").st_dev
    except OSError:
        dev = -1
    try:
        net = os.readlink("/proc/thread-self/ns/net")  # this thread: a test may create endpoints in another
    except OSError:
        net = ""
    return f"{socket.gethostname()}/{boot}/{dev}/{net}"


def shm_host(ep: "Endpoint") -> str:
    """The host id under which same-host peers may map `ep`'s shm regions; "" when they must use the wire."""
    return getattr(ep, "host_id", "") if ep.backend == "shm" or getattr(ep, "shm_fast_path", False) else ""


class Peer(abc.ABC):
    name: str

    @abc.abstractmethod
    async def write(self, ops: list[Op], cls: TrafficClass, *, timeout: float | None = None,
                    grant: Grant | None = None) -> None:
        """Returns when all bytes are in the remote region; every op's remote range must lie inside
        `grant` (NotGranted otherwise)."""

    @abc.abstractmethod
    async def read(self, ops: list[Op], cls: TrafficClass, *, timeout: float | None = None,
                   grant: Grant | None = None) -> None:
        ...

    def refresh(self, remote: EndpointDesc) -> None:
        ...

    @abc.abstractmethod
    async def close(self) -> None:
        """Drop the connection; in-flight transfers fail with PeerGone."""


class Endpoint(abc.ABC):
    """One traffic-manager's side of the data plane."""

    backend: str  # the concrete backend ("shm" | "tcp" | "verbs"), also under "auto"
    why: str = ""  # why the registry built this backend (start-up logs)

    @abc.abstractmethod
    async def start(self) -> None:
        ...

    @abc.abstractmethod
    def desc(self) -> EndpointDesc:
        ...

    @abc.abstractmethod
    def register(self, name: str, buf: memoryview, *, shm_name: str = "", remote: bool = True) -> RegionDesc:
        """`remote=False` keeps the region from peers: only `copy_local` reaches it."""

    @abc.abstractmethod
    def unregister(self, name: str) -> None:
        ...

    @abc.abstractmethod
    def grant(self, region: str, ranges: Iterable[tuple[int, int]] | None = None, *, read: bool = True,
              write: bool = True) -> Grant:
        """A grant of `ranges` ((offset, length); None = all) of a region registered for peers."""

    @abc.abstractmethod
    def revoke(self, grant: Grant) -> bool:
        """End a grant this endpoint made; peers' frames naming it are refused from then on."""

    @abc.abstractmethod
    async def connect(self, remote: EndpointDesc) -> Peer:
        ...

    @abc.abstractmethod
    async def copy_local(self, ops: list[Op], cls: TrafficClass, *, timeout: float | None = None) -> None:
        """Copy between two local regions (buffer <-> KV memory), class-scheduled."""

    @abc.abstractmethod
    async def close(self) -> None:
        ...
