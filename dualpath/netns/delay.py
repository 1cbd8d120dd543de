"""`python -m dualpath.netns.delay --queue N --ms D`: hold each queued packet D ms, then pass it.

For kernels without `netem`: an NFQUEUE rule (links.py) parks packets in the kernel, and this
process accepts them over netfilter netlink once D ms old. The queue fails open.
"""
from __future__ import annotations

import argparse
import collections
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
MSG_PACKET, MSG_CONFIG, MSG_VERDICT_BATCH = 0, 2, 3
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
CFG_CMD, CFG_PARAMS, CFG_QUEUE_MAXLEN, CFG_MASK, CFG_FLAGS = 1, 2, 3, 4, 5
CMD_BIND = 1
COPY_META = 1
F_FAIL_OPEN, F_GSO = 1, 4
PACKET_HDR, VERDICT_HDR = 1, 2
NF_ACCEPT = 1
NLH = struct.Struct("=IHHII")  # len, type, flags, seq, pid (host order)
NFGEN = struct.Struct("=BBH")  # family, version, res_id (big-endian: packed by hand)


def _attr(kind: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * ((4 - n % 4) % 4)


def _msg(kind: int, queue: int, attrs: bytes, seq: int, flags: int = NLM_F_REQUEST) -> bytes:
    body = NFGEN.pack(socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return NLH.pack(NLH.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, seq, 0) + body


def _packet_ids(data: bytes) -> list[int]:
    """Packet ids of the PACKET messages in one netlink datagram."""
    ids, off = [], 0
    while off + NLH.size <= len(data):
        n, kind, _, _, _ = NLH.unpack_from(data, off)
        if n < NLH.size:
            break
        if kind == (NFNL_SUBSYS_QUEUE << 8) | MSG_PACKET:
            a = off + NLH.size + NFGEN.size
            while a + 4 <= off + n:
                alen, akind = struct.unpack_from("=HH", data, a)
                if alen < 4:
                    break
                if akind & 0x7FFF == PACKET_HDR:
                    ids.append(struct.unpack_from(">I", data, a + 4)[0])
                a += (alen + 3) & ~3
        off += (n + 3) & ~3
    return ids


class Delayer:
    """Binds queue `queue` and accepts each packet `delay_s` after it arrived."""

    def __init__(self, queue: int, delay_s: float, maxlen: int = 1 << 16) -> None:
        self.queue, self.delay_s = queue, delay_s
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind((0, 0))
        self.seq = 0
        self.waiting: collections.deque[tuple[float, int]] = collections.deque()  # (due, packet id)
        self._config(_attr(CFG_CMD, struct.pack(">BBH", CMD_BIND, 0, socket.AF_INET)))
        self._config(_attr(CFG_PARAMS, struct.pack(">IB", 0xFFFF, COPY_META))
                     + _attr(CFG_QUEUE_MAXLEN, struct.pack(">I", maxlen))
                     + _attr(CFG_MASK, struct.pack(">I", F_FAIL_OPEN | F_GSO))
                     + _attr(CFG_FLAGS, struct.pack(">I", F_FAIL_OPEN | F_GSO)))

    def _config(self, attrs: bytes) -> None:
        self.seq += 1
        self.sock.send(_msg(MSG_CONFIG, self.queue, attrs, self.seq, NLM_F_REQUEST | NLM_F_ACK))
        data = self.sock.recv(65536)
        n, kind, _, _, _ = NLH.unpack_from(data, 0)
        if kind == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", data, NLH.size)
            if err:
                raise OSError(-err, f"nfqueue config of queue {self.queue}: errno {-err}")

    def _accept_through(self, packet_id: int) -> None:
        self.seq += 1
        self.sock.send(_msg(MSG_VERDICT_BATCH, self.queue, _attr(VERDICT_HDR, struct.pack(">II", NF_ACCEPT, packet_id)),
                            self.seq))

    def run(self, stop: list[bool]) -> None:
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        while not stop[0]:
            now = time.monotonic()
            wait_ms = max(0.0, (self.waiting[0][0] - now) * 1000) if self.waiting else 200.0
            if poller.poll(wait_ms):
                try:
                    data = self.sock.recv(1 << 16)
                except OSError:  # ENOBUFS: the kernel dropped messages; fail-open passes those packets
                    data = b""
                due = time.monotonic() + self.delay_s
                self.waiting.extend((due, i) for i in _packet_ids(data))
            now, last = time.monotonic(), -1
            while self.waiting and self.waiting[0][0] <= now:
                last = self.waiting.popleft()[1]
            if last >= 0:
                self._accept_through(last)
        if self.waiting:  # leaving: release what is held rather than drop it
            self._accept_through(self.waiting[-1][1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queue", type=int, required=True, help="NFQUEUE number the link's rule sends to")
    ap.add_argument("--ms", type=float, required=True, help="delay per packet in milliseconds")
    args = ap.parse_args(argv)
    stop = [False]
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.__setitem__(0, True))
    d = Delayer(args.queue, args.ms / 1000)
    print(f"delaying queue {args.queue} by {args.ms:g} ms", flush=True)
    d.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
