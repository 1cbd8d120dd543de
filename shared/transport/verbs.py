"""The verbs backend's device half: pyverbs RC QPs, MRs, RDMA WRITE/READ, CQ polling.

Grants are checked by the initiator only: an MR covers a whole region, so a peer that ignores
its grant reaches the whole buffer (never the KV memory, which has no remote access).
"""

from __future__ import annotations

import asyncio
import ctypes
import random
import sys
from collections.abc import Sequence
from typing import Any

from .aio import deadline
from .base import Endpoint, EndpointDesc, Op, Peer, RegionDesc, TrafficClass
from .classes import DEFAULT_WEIGHTS
from .errors import BackendUnavailable, PeerGone
from .grants import Grant, check_grant
from .side_channel import SideChannel, exchange
from .tcp_auth import key_of
from .local import LocalSide
from .shm import ShmPeer, shm_reachable
from .verbs_plan import (SL_DEFAULT, ConnectReply, ConnectRequest, MrBook, QpInfo, WrBatch,
                         decode_setup, encode_setup, plan)

DEBIAN_DIST = "/usr/lib/python3/dist-packages"  # where `apt-get install python3-pyverbs` puts it
CLASSES = (TrafficClass.LATENCY, TrafficClass.BULK)


def load_pyverbs() -> Any:
    """Import pyverbs (falling back to Debian's dist-packages) or raise BackendUnavailable."""
    try:
        import pyverbs.device  # noqa: F401
    except ImportError:
        if DEBIAN_DIST not in sys.path:
            sys.path.append(DEBIAN_DIST)  # appended: the venv's own packages still win
        try:
            import pyverbs.device  # noqa: F401
        except ImportError as exc:
            raise BackendUnavailable("verbs", f"pyverbs not importable: {exc}") from None
    import pyverbs

    return pyverbs


def probe() -> str | None:
    """None if an RDMA device is usable; else the reason (for logs and test skips)."""
    try:
        load_pyverbs()
        from pyverbs.device import get_device_list

        devs = get_device_list()
    except BackendUnavailable as exc:
        return exc.reason
    except Exception as exc:  # pyverbs raises PyverbsRDMAError without a device
        return f"no RDMA device: {type(exc).__name__}: {exc}"
    return None if devs else "no RDMA device: get_device_list() is empty"


def buffer_address(buf: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


class _Device:
    def __init__(self, name: str, port_num: int, gid_index: int) -> None:
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.pd import PD

        self.ctx = Context(name=name)
        self.pd = PD(self.ctx)
        self.port_num, self.gid_index = port_num, gid_index
        self.lid = self.ctx.query_port(port_num).lid
        self.gid = str(self.ctx.query_gid(port_num, gid_index))
        self.cqs = {c: CQ(self.ctx, 4096) for c in CLASSES}

    def new_qp(self, cls: TrafficClass) -> Any:
        from pyverbs.enums import IBV_QPT_RC
        from pyverbs.qp import QP, QPCap, QPInitAttr

        cap = QPCap(max_send_wr=1024, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        cq = self.cqs[cls]
        return QP(self.pd, QPInitAttr(qp_type=IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))

    def to_rts(self, qp: Any, mine: QpInfo, theirs: QpInfo, lid: int, gid: str) -> None:
        import pyverbs.enums as e
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.qp import QPAttr

        gr = GlobalRoute(dgid=GID(gid), sgid_index=self.gid_index)
        attr = QPAttr(port_num=self.port_num)
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        attr.ah_attr = AHAttr(port_num=self.port_num, is_global=1, gr=gr, dlid=lid, sl=mine.sl)
        attr.dest_qp_num, attr.rq_psn, attr.sq_psn = theirs.qpn, theirs.psn, mine.psn
        attr.path_mtu, attr.max_dest_rd_atomic, attr.max_rd_atomic = e.IBV_MTU_1024, 16, 16
        attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
        qp.to_rts(attr)


class VerbsPeer(Peer):
    """One RC QP per class to one remote endpoint."""

    def __init__(self, name: str, dev: _Device, qps: dict[int, Any], book: MrBook, timeout: float | None) -> None:
        self.name, self._dev, self._qps, self._book, self._timeout = name, dev, qps, book, timeout
        self._locks = {c: asyncio.Lock() for c in CLASSES}  # one outstanding chain per QP
        self._gone = ""

    def refresh(self, remote: EndpointDesc) -> None:
        self._book.set_remote(remote.regions)

    async def write(self, ops: list[Op], cls: TrafficClass, *, timeout: float | None = None,
                    grant: Grant | None = None) -> None:
        check_grant(self.name, grant, ops, True)
        await self._post(ops, cls, timeout, read=False)

    async def read(self, ops: list[Op], cls: TrafficClass, *, timeout: float | None = None,
                   grant: Grant | None = None) -> None:
        check_grant(self.name, grant, ops, False)
        await self._post(ops, cls, timeout, read=True)

    async def _post(self, ops: list[Op], cls: TrafficClass, timeout: float | None, read: bool) -> None:
        if self._gone:
            raise PeerGone(self.name, self._gone)
        batches = plan([self._book.translate(o) for o in ops])
        async with deadline(timeout if timeout is not None else self._timeout, self.name, sum(o.length for o in ops)):
            async with self._locks[cls]:
                for b in batches:
                    self._qps[cls].post_send(_chain(b, read))
                    await self._poll(cls)

    async def _poll(self, cls: TrafficClass) -> None:
        cq = self._dev.cqs[cls]
        while True:
            n, wcs = cq.poll(1)
            if n:
                if wcs[0].status != 0:
                    self._gone = f"work completion status {wcs[0].status}"
                    raise PeerGone(self.name, self._gone)
                return
            await asyncio.sleep(0)  # busy-poll, yielding to the loop

    async def close(self) -> None:
        self._gone = self._gone or "closed locally"
        for qp in self._qps.values():
            qp.close()


def _chain(batch: WrBatch, read: bool) -> Any:
    import pyverbs.enums as e
    from pyverbs.wr import SGE, SendWR

    op = e.IBV_WR_RDMA_READ if read else e.IBV_WR_RDMA_WRITE
    head = prev = None
    for i, (w, sig) in enumerate(zip(batch.wrs, batch.signaled)):
        wr = SendWR(wr_id=i, opcode=op, num_sge=1, sg=[SGE(w.laddr, w.length, w.lkey)],
                    send_flags=e.IBV_SEND_SIGNALED if sig else 0)
        wr.set_wr_rdma(w.rkey, w.raddr)
        if prev is None:
            head = wr
        else:
            prev.next_wr = wr
        prev = wr
    return head


class VerbsEndpoint(LocalSide, Endpoint):
    """MRs for every region; a side channel on host:port brings up QPs per peer."""

    backend = "verbs"

    def __init__(self, node: str, host: str = "127.0.0.1", port: int = 0, weights: Sequence[int] = DEFAULT_WEIGHTS,
                 device: str = "", port_num: int = 1, gid_index: int = 0, sl: dict[int, int] | None = None,
                 timeout: float | None = None, shm_fast_path: bool = False,
                 secret: bytes | str | None = None) -> None:
        reason = probe()
        if reason is not None:
            raise BackendUnavailable("verbs", reason)
        from pyverbs.device import get_device_list

        name = device or get_device_list()[0].name.decode()
        super().__init__(node, weights, timeout)
        self.dev = _Device(name, port_num, gid_index)
        self.host, self.port, self.sl = host, port, dict(sl or SL_DEFAULT)
        self.shm_fast_path = shm_fast_path
        self.key = key_of(secret)  # None: this process's own secret (tcp_auth.py)
        self._mrs: list[Any] = []
        self._side = SideChannel(node, self.key, self._on_setup)
        self._peers: list[Peer] = []

    def register(self, name: str, buf: memoryview, *, shm_name: str = "", remote: bool = True) -> RegionDesc:
        import pyverbs.enums as e
        from pyverbs.mr import MR

        access = e.IBV_ACCESS_LOCAL_WRITE
        if remote:  # a local region's MR has no remote access: its rkey opens nothing
            access |= e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        addr = buffer_address(buf)
        mr = MR(self.dev.pd, len(buf), access, address=addr)
        self._mrs.append(mr)
        desc = self.regions.add(name, buf, shm_name=shm_name, remote=remote, addr=addr, rkey=mr.rkey)
        return desc

    def unregister(self, name: str) -> None:
        self._mrs.pop(self.regions.drop(name)).close()  # the MRs are kept in the regions' order

    def _book(self, remote: list[RegionDesc]) -> MrBook:
        book = MrBook()
        for d, mr in zip(self.regions.descs(), self._mrs):
            book.add_local(d.name, d.addr, d.size, mr.lkey)
        book.set_remote(remote)
        return book

    async def start(self) -> None:
        self.port = await self._side.start(self.host, self.port)

    @property
    def refused(self) -> int:
        return self._side.refused

    def desc(self) -> EndpointDesc:
        return self.base_desc(host=self.host, port=self.port, gid=self.dev.gid, lid=self.dev.lid, sl=self.sl)

    def _new_qps(self) -> tuple[dict[int, Any], list[QpInfo]]:
        qps = {c: self.dev.new_qp(c) for c in CLASSES}
        return qps, [QpInfo(c, qps[c].qp_num, random.getrandbits(24), self.sl[c]) for c in CLASSES]

    def _bring_up(self, qps: dict[int, Any], mine: list[QpInfo], msg: ConnectRequest | ConnectReply) -> None:
        theirs = {q.cls: q for q in msg.qps}
        for m in mine:
            self.dev.to_rts(qps[m.cls], m, theirs[m.cls], msg.lid, msg.gid)

    async def _on_setup(self, body: bytes) -> bytes:
        req = decode_setup(body)
        if not isinstance(req, ConnectRequest):
            raise PeerGone("?", f"expected a ConnectRequest, got {type(req).__name__}")
        qps, mine = self._new_qps()
        self._bring_up(qps, mine, req)
        self._peers.append(VerbsPeer(req.node, self.dev, qps, self._book(req.regions), self.timeout))
        return encode_setup(ConnectReply(self.node, self.dev.lid, self.dev.gid, mine, self.regions.remote_descs()))

    async def connect(self, remote: EndpointDesc) -> Peer:
        if self.shm_fast_path and shm_reachable(self.host_id, remote):
            return ShmPeer(self.regions, self.copier, remote, self.timeout)
        qps, mine = self._new_qps()
        req = encode_setup(ConnectRequest(self.node, self.dev.lid, self.dev.gid, mine, self.regions.remote_descs()))
        rep = decode_setup(await exchange(remote.host, remote.port, self.key, remote.node, req))
        if not isinstance(rep, ConnectReply):
            raise PeerGone(remote.node, f"verbs setup: expected a ConnectReply, got {type(rep).__name__}")
        self._bring_up(qps, mine, rep)
        peer = VerbsPeer(remote.node, self.dev, qps, self._book(rep.regions), self.timeout)
        self._peers.append(peer)
        return peer

    async def close(self) -> None:
        await self._side.close()
        for p in self._peers:
            await p.close()
        for mr in self._mrs:
            mr.close()
        self.close_local()
