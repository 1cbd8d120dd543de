"""Helpers for tests whose hosts are network namespaces (dualpath/netns/)."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from dualpath.netns.fabric import Fabric, Host
from dualpath.netns.links import Links
from dualpath.netns.nsenter import entered


@dataclass
class Hosts:
    """A fabric with two hosts, "a" and "b", on kernel-shaped links."""

    fabric: Fabric
    links: Links
    a: Host
    b: Host


def run_in(ns: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """`asyncio.run(main())` on a thread inside namespace `ns`; its exception is raised here."""
    err: list[BaseException] = []

    def body() -> None:
        try:
            with entered(ns):
                asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            err.append(exc)

    t = threading.Thread(target=body, name=f"in-{ns}")
    t.start()
    t.join()
    if err:
        raise err[0]
