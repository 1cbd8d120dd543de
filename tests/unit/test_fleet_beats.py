"""The fleet emulator announces as the services do: an unchanged announcement only as a keepalive."""
import asyncio

import pytest

from dualpath.fleet.group import FleetGroup, parser

pytestmark = pytest.mark.unit


class FakeBus:
    def __init__(self):
        self.sent = []

    async def publish(self, subject, msg):
        self.sent.append((subject, msg))


def _group(quiet: int) -> tuple[FleetGroup, FakeBus]:
    bus = FakeBus()
    args = parser().parse_args(["--nats-url", "nats://unused", "--nodes", "p0:prefill:2,d0:decode:2",
                                "--decode-engines", "96", "--quiet-beats", str(quiet)])
    return FleetGroup(bus, args), bus


@pytest.mark.parametrize("quiet,per_four", [(0, 4), (1, 2), (3, 1)])
def test_unchanged_announcements_go_out_every_quiet_plus_one_beats(quiet, per_four):
    group, bus = _group(quiet)
    n = len(group.services)  # per node a gateway, per engine the engine and its traffic manager
    assert n == 2 * (1 + 2 * 2)
    got = [asyncio.run(group.beat(group.services)) for _ in range(4)]
    assert sum(got) == n * per_four == len(bus.sent)


def test_a_changed_engine_announcement_goes_out_at_the_next_beat():
    group, bus = _group(1)
    engine = next(e for e in group.engines.values())
    mine = [s for s in group.services if getattr(s[0], "__self__", None) is engine]
    assert len(mine) == 1
    asyncio.run(group.beat(mine))  # first beat: out
    assert asyncio.run(group.beat(mine)) == 0  # unchanged: skipped
    orig = engine.announce
    try:
        engine.announce = lambda: __import__("msgspec").structs.replace(orig(), total_blocks=orig().total_blocks + 1)
        mine[0] = (engine.announce, *mine[0][1:])
        assert asyncio.run(group.beat(mine)) == 1  # changed: out at once
    finally:
        engine.announce = orig
