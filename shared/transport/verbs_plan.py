"""The verbs backend's pure parts: MR bookkeeping, WR batching, setup messages, SLs."""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from .base import Op, RegionDesc, TrafficClass
from .errors import RegionNotFound
from .regions import check_bounds

SL_DEFAULT: dict[int, int] = {TrafficClass.LATENCY: 3, TrafficClass.BULK: 0}
MAX_WR = 64  # WRs per doorbell (chain length)
MAX_BATCH_BYTES = 16 << 20  # bytes per doorbell: bounds head-of-line blocking per QP
MAX_MSG = 1 << 30  # ibv port max_msg_sz is >= 1 GiB on every NIC we target


class Wr(NamedTuple):
    laddr: int
    lkey: int
    raddr: int
    rkey: int
    length: int


class WrBatch(NamedTuple):
    wrs: list[Wr]
    signaled: list[bool]  # True only on the last WR: one completion per doorbell


class LocalMr(NamedTuple):
    addr: int
    length: int
    lkey: int


class MrBook:
    """Local MRs and the remote regions learned from a ConnectReply / EndpointDesc."""

    def __init__(self) -> None:
        self.local: dict[str, LocalMr] = {}
        self.remote: dict[str, RegionDesc] = {}

    def add_local(self, name: str, addr: int, length: int, lkey: int) -> None:
        self.local[name] = LocalMr(addr, length, lkey)

    def set_remote(self, regions: list[RegionDesc]) -> None:
        self.remote = {r.name: r for r in regions}

    def translate(self, op: Op) -> Wr:
        """Bounds-checked (laddr, lkey, raddr, rkey, len) for one op (either direction)."""
        mr = self.local.get(op.local_region)
        if mr is None:
            raise RegionNotFound(op.local_region)
        rr = self.remote.get(op.remote_region)
        if rr is None:
            raise RegionNotFound(op.remote_region, where="remote")
        check_bounds(op.local_region, op.local_offset, op.length, mr.length)
        check_bounds(op.remote_region, op.remote_offset, op.length, rr.size)
        return Wr(mr.addr + op.local_offset, mr.lkey, rr.addr + op.remote_offset, rr.rkey, op.length)


def _split_wr(w: Wr, max_msg: int) -> list[Wr]:
    if w.length <= max_msg:
        return [w]
    return [
        Wr(w.laddr + o, w.lkey, w.raddr + o, w.rkey, min(max_msg, w.length - o))
        for o in range(0, w.length, max_msg)
    ]


def plan(wrs: list[Wr], max_wr: int = MAX_WR, max_bytes: int = MAX_BATCH_BYTES, max_msg: int = MAX_MSG) -> list[WrBatch]:
    """Doorbell batches in submission order; every batch has >= 1 WR, last one signaled."""
    out: list[WrBatch] = []
    cur: list[Wr] = []
    size = 0
    for w in (p for w in wrs for p in _split_wr(w, max_msg)):
        if cur and (len(cur) == max_wr or size + w.length > max_bytes):
            out.append(_close(cur))
            cur, size = [], 0
        cur.append(w)
        size += w.length
    if cur:
        out.append(_close(cur))
    return out


def _close(wrs: list[Wr]) -> WrBatch:
    return WrBatch(wrs, [False] * (len(wrs) - 1) + [True])


def sl_for(cls: TrafficClass, sl_map: dict[int, int] | None = None) -> int:
    return (sl_map or SL_DEFAULT)[int(cls)]


class QpInfo(msgspec.Struct, array_like=True):
    cls: int  # TrafficClass this QP carries
    qpn: int
    psn: int
    sl: int


class ConnectRequest(msgspec.Struct, tag="req"):
    """Initiator -> target: my QPs (one per class), my port address, my regions."""

    node: str
    lid: int
    gid: str
    qps: list[QpInfo]
    regions: list[RegionDesc] = []


class ConnectReply(msgspec.Struct, tag="rep"):
    """Target -> initiator: the target's QPs (created for this initiator) and regions."""

    node: str
    lid: int
    gid: str
    qps: list[QpInfo]
    regions: list[RegionDesc] = []


Setup = ConnectRequest | ConnectReply
_DECODER = msgspec.msgpack.Decoder(Setup)


def encode_setup(msg: Setup) -> bytes:
    return msgspec.msgpack.encode(msg)


def decode_setup(data: bytes) -> Setup:
    return _DECODER.decode(data)
