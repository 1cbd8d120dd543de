"""Backends by name: `create_endpoint("shm" | "tcp" | "verbs" | "auto", ...)`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .base import Endpoint
from .classes import DEFAULT_WEIGHTS
from .errors import BackendUnavailable


def _shm(node: str, host: str, port: int, weights: Sequence[int], **opts: Any) -> Endpoint:
    from .shm import ShmEndpoint

    return ShmEndpoint(node, weights, timeout=opts.get("timeout"))


def _tcp(node: str, host: str, port: int, weights: Sequence[int], **opts: Any) -> Endpoint:
    from .tcp import TcpEndpoint

    return TcpEndpoint(node, host, port, weights, timeout=opts.get("timeout"),
                       shm_fast_path=opts.get("shm_fast_path", False), secret=opts.get("secret"))


def _verbs(node: str, host: str, port: int, weights: Sequence[int], **opts: Any) -> Endpoint:
    from .verbs import VerbsEndpoint  # imports pyverbs

    return VerbsEndpoint(node, host, port, weights, **opts)


def _auto(node: str, host: str, port: int, weights: Sequence[int], **opts: Any) -> Endpoint:
    opts.setdefault("shm_fast_path", True)
    try:
        ep = _verbs(node, host, port, weights, **opts)
        ep.why = _AUTO_VERBS
    except BackendUnavailable as exc:
        ep = _tcp(node, host, port, weights, **opts)
        ep.why = _auto_tcp(exc.reason)
    return ep


_AUTO_VERBS = "auto: an RDMA device is usable; same-host peers use shm"


def _auto_tcp(reason: str) -> str:
    return f"auto: verbs unavailable ({reason}); same-host peers use shm"


def choose(backend: str) -> tuple[str, str]:
    """What `backend` resolves to here, and why: "auto" is verbs with an RDMA device, else tcp."""
    if backend != "auto":
        return backend, "requested"
    from .verbs import probe  # imports pyverbs only if it is installed

    reason = probe()
    return ("verbs", _AUTO_VERBS) if reason is None else ("tcp", _auto_tcp(reason))


BACKENDS: dict[str, Callable[..., Endpoint]] = {"shm": _shm, "tcp": _tcp, "verbs": _verbs, "auto": _auto}


def create_endpoint(
    backend: str,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    node: str = "tm",
    weights: Sequence[int] = DEFAULT_WEIGHTS,
    **opts: Any,
) -> Endpoint:
    """An endpoint, not started. opts: timeout (s), shm_fast_path, secret (the mesh's data-plane
    secret; none = this process's own); verbs: device, port_num, gid_index, sl."""
    try:
        factory = BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown transport backend {backend!r}; choose from {sorted(BACKENDS)}") from None
    ep = factory(node, host, port, weights, **opts)
    ep.why = ep.why or "requested"
    return ep
