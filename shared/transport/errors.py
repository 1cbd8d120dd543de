"""Typed data-plane errors: every failure that crosses the transport boundary."""

from __future__ import annotations


class TransportError(Exception):
    ...


class BackendUnavailable(TransportError):
    """A backend cannot run here (no RDMA device, pyverbs missing)."""

    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(f"backend {backend!r} unavailable: {reason}")
        self.backend = backend
        self.reason = reason


class RegionNotFound(TransportError):
    """A region name (or wire id) is not registered on the side that was asked."""

    def __init__(self, name: str, where: str = "local") -> None:
        super().__init__(f"{where} region {name!r} not registered")
        self.name = name
        self.where = where


class OutOfBounds(TransportError):
    def __init__(self, region: str, offset: int, length: int, size: int) -> None:
        super().__init__(f"region {region!r}: [{offset}, {offset}+{length}) outside size {size}")
        self.region = region
        self.offset = offset
        self.length = length
        self.size = size


class NotGranted(TransportError):
    """A transfer reaches bytes its grant does not cover; `why`: "read", "write" or "no live grant"."""

    def __init__(self, region: str, offset: int, length: int, why: str) -> None:
        super().__init__(f"region {region!r}: [{offset}, {offset}+{length}) not granted ({why})")
        self.region = region
        self.offset = offset
        self.length = length
        self.why = why


class PeerGone(TransportError):
    """The remote endpoint closed, died or its connection broke."""

    def __init__(self, peer: str, reason: str = "") -> None:
        super().__init__(f"peer {peer!r} gone" + (f": {reason}" if reason else ""))
        self.peer = peer
        self.reason = reason


class TransferTimeout(TransportError):
    def __init__(self, peer: str, timeout: float, nbytes: int) -> None:
        super().__init__(f"transfer of {nbytes} B with {peer!r} exceeded {timeout:.3f}s")
        self.peer = peer
        self.timeout = timeout
        self.nbytes = nbytes


class RemoteError(TransportError):
    """The remote side rejected a request for a reason with no closer class."""

    def __init__(self, peer: str, code: int, detail: str) -> None:
        super().__init__(f"peer {peer!r} error {code}: {detail}")
        self.peer = peer
        self.code = code
        self.detail = detail


class AuthFailed(PeerGone):
    """A data-plane handshake failed (a PeerGone, so it is dropped alike); `reason` holds no secret."""

    def __init__(self, peer: str, reason: str) -> None:
        super().__init__(peer, f"authentication failed: {reason}")
        self.auth_reason = reason
