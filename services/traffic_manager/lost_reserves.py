"""Reservations a lost NATS connection orphaned: their Release or Cancel may have been sent meanwhile."""
from __future__ import annotations

import asyncio
from collections.abc import Callable


def orphaned(reserved_on: dict[str, asyncio.Future], holds: Callable[[str], bool]) -> list[str]:
    """The ids reserved on a connection now gone that still hold slots; every gone entry leaves `reserved_on`."""
    out = []
    for req_id, conn in list(reserved_on.items()):
        if not conn.done():
            continue  # made on the connection of now
        del reserved_on[req_id]
        if holds(req_id):
            out.append(req_id)
    return out
