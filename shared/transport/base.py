"""The data-plane contract: descriptors, traffic classes, ops, Endpoint and Peer.

Owns the types every backend (shm, tcp, verbs) implements and every traffic-manager
uses; owns no I/O. Bulk KV bytes move only through these calls, never over NATS; what
travels over NATS is an `EndpointDesc` (msgspec, so it can ride in any control message).

Model: an endpoint owns named *regions* (its DRAM buffer, its engine's KV memory). A
transfer is one-sided: the initiator names (remote region, offset, length) and the
remote CPU runs no per-transfer logic beyond what the backend needs. A peer reaches a
remote region only through a `Grant` its owner made for the transfer (grants.py) and
handed over on the control plane; tcp checks every frame against it on the serving side.

Example sequence (PE traffic-manager pulls two layer blocks from a DE buffer):
    ep = create_endpoint("tcp", node="pe0"); await ep.start()
    ep.register("kv", kv_shm.buf, shm_name=kv_shm.name, remote=False)
    # ... DE TM announced de_desc = de_ep.desc() over NATS, and replied to a Reserve with
    # g = de_ep.grant("buf", [(4096, 96 << 10), (200704, 96 << 10)]) ...
    peer = await ep.connect(de_desc)
    await peer.read([Op("kv", 0, "buf", 4096, 96 << 10),
                     Op("kv", 96 << 10, "buf", 200704, 96 << 10)], TrafficClass.LATENCY, grant=g)
    # returns once both blocks are in local "kv"; PeerGone / TransferTimeout otherwise.
"""

from __future__ import annotations

import abc
import enum
import os
import socket
from collections.abc import Iterable

import msgspec

from .grants import Grant


class TrafficClass(enum.IntEnum):
    """Two classes on every link (DESIGN §5)."""

    LATENCY = 0  # layer blocks on the critical path of a running prefill
    BULK = 1  # storage prefetch for queued work, persistence of decoded blocks


class Op(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One contiguous copy. For write/copy_local: local -> remote; for read: remote -> local.

    For `Endpoint.copy_local`, `remote_region` names another region of the same endpoint.
    """

    local_region: str
    local_offset: int
    remote_region: str
    remote_offset: int
    length: int


def coalesce(ops: list[Op]) -> list[Op]:
    """Merge runs of ops that continue each other on both sides into one op each.

    Layer blocks of consecutive KV blocks often sit back to back in KV memory and in buffer
    slots; one copy (or one frame) then moves the run, instead of one per block. Order kept.
    Example: [Op("kv", 0, "buf", 0, 8), Op("kv", 8, "buf", 8, 8)] -> [Op("kv", 0, "buf", 0, 16)].
    """
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
    """A registered region as announced to peers (immutable: descs are shared)."""

    name: str
    size: int
    rid: int = 0  # small wire id (tcp header field), unique per endpoint
    shm: str = ""  # POSIX shm segment name when the region lives in /dev/shm
    addr: int = 0  # verbs: virtual address the MR was registered at
    rkey: int = 0  # verbs: remote key of the MR


class EndpointDesc(msgspec.Struct, omit_defaults=True):
    """Everything a peer needs to connect; re-read `desc()` after registering regions."""

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
    """Whether two announcements describe one endpoint's life (a later one may add regions); a
    restarted peer has a new pid, port or liveness segment, and a peer connected to the old one
    must connect again (its mappings and sockets reach a process that is gone)."""
    return (a.backend, a.host_id, a.pid, a.host, a.port, a.alive, a.gid, a.lid) == \
        (b.backend, b.host_id, b.pid, b.host, b.port, b.alive, b.gid, b.lid)


def host_id() -> str:
    """Identify this host *and* its /dev/shm mount: equal ids can share segments.

    The network namespace is part of it: processes in two namespaces of one machine are
    two hosts to the data plane (dualpath/netns/ emulates hosts that way), so they talk tcp."""
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
    """The host id under which processes on `ep`'s host may map its shm regions directly: the shm
    backend, or tcp / verbs with the shm fast path ("auto"); "" when peers are to use the wire only
    (`transport = "tcp"` or `"verbs"` chosen outright)."""
    return getattr(ep, "host_id", "") if ep.backend == "shm" or getattr(ep, "shm_fast_path", False) else ""


class Peer(abc.ABC):
    """A connection from a local endpoint to one remote endpoint."""

    name: str

    @abc.abstractmethod
    async def write(self, ops: list[Op], cls: TrafficClass, *, timeout: float | None = None,
                    grant: Grant | None = None) -> None:
        """Copy local -> remote for every op; returns when all bytes are in the remote region.

        Every op's remote range must lie inside `grant` (NotGranted otherwise, or without one)."""

    @abc.abstractmethod
    async def read(self, ops: list[Op], cls: TrafficClass, *, timeout: float | None = None,
                   grant: Grant | None = None) -> None:
        """Copy remote -> local for every op; returns when all bytes are in the local region."""

    def refresh(self, remote: EndpointDesc) -> None:
        """Take a newer announcement of the same remote (regions registered after connect)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Drop the connection; in-flight transfers fail with PeerGone."""


class Endpoint(abc.ABC):
    """One traffic-manager's side of the data plane."""

    backend: str  # the concrete backend ("shm" | "tcp" | "verbs"), also under "auto"
    why: str = ""  # why the registry built this backend (start-up logs)

    @abc.abstractmethod
    async def start(self) -> None:
        """Bind servers / open devices. Regions may be registered before or after."""

    @abc.abstractmethod
    def desc(self) -> EndpointDesc:
        """The current announcement (includes every region registered so far)."""

    @abc.abstractmethod
    def register(self, name: str, buf: memoryview, *, shm_name: str = "", remote: bool = True) -> RegionDesc:
        """Make `buf` addressable as `name`; `shm_name` if it is a /dev/shm segment.

        `remote=False` keeps it local: `copy_local` reaches it, no peer can (it is not announced)."""

    @abc.abstractmethod
    def unregister(self, name: str) -> None:
        """Forget region `name`; RegionNotFound if it is not registered."""

    @abc.abstractmethod
    def grant(self, region: str, ranges: Iterable[tuple[int, int]] | None = None, *, read: bool = True,
              write: bool = True) -> Grant:
        """A grant of `ranges` ((offset, length); None = all) of a region registered for peers."""

    @abc.abstractmethod
    def revoke(self, grant: Grant) -> bool:
        """End a grant this endpoint made; peers' frames naming it are refused from then on."""

    @abc.abstractmethod
    async def connect(self, remote: EndpointDesc) -> Peer:
        """Open a peer to `remote` (shm fast path where possible under "auto")."""

    @abc.abstractmethod
    async def copy_local(self, ops: list[Op], cls: TrafficClass, *, timeout: float | None = None) -> None:
        """Copy between two local regions (buffer <-> KV memory: H2D/D2H), class-scheduled."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop serving; peers connected to us see PeerGone."""
