"""A traffic manager back on NATS frees the reservations made on the lost connection (their Release may be lost)."""
import asyncio

import pytest

from services.traffic_manager.lost_reserves import orphaned
from shared.bus import Losses

pytestmark = pytest.mark.unit


def test_only_reservations_of_the_lost_connection_that_still_hold_slots_are_orphaned():
    async def go():
        losses = Losses()
        reserved = {"old-held": losses.current(), "old-loaded": losses.current()}
        losses.lost()  # NATS went away: the connection of these two is gone
        reserved["new"] = losses.current()  # reserved after the reconnect
        got = orphaned(reserved, holds=lambda r: r != "old-loaded")
        return got, reserved
    got, left = asyncio.run(go())
    assert got == ["old-held"]
    assert list(left) == ["new"]  # the gone entries are pruned, held or not


def test_nothing_is_orphaned_while_the_connection_lasts():
    async def go():
        losses = Losses()
        reserved = {"a": losses.current(), "b": losses.current()}
        return orphaned(reserved, holds=lambda r: True), reserved
    got, left = asyncio.run(go())
    assert got == [] and set(left) == {"a", "b"}
