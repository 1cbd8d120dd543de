"""The traffic manager's progress entries (progress.py): an entry lives while someone holds it, an
unheld one (a report that came before its holder) is swept after its TTL, and a read track
has a layer only once it landed (the last only once verified)."""
from __future__ import annotations

import pytest

from services.traffic_manager import progress
from services.traffic_manager.progress import LayerState, ReadTrack, Registry

pytestmark = pytest.mark.unit


def test_an_entry_lives_while_held_and_goes_with_its_last_holder():
    reg = Registry(LayerState)
    a = reg.hold("r")
    assert reg.hold("r") is a and reg.get("r") is a
    reg.release("r")
    assert reg.items == {"r": a}
    reg.release("r")
    assert reg.items == {}
    reg.release("r")  # released again (a late finally): nothing to do
    assert reg.items == {} and reg.get("r") is not a


class Clock:
    def __init__(self):
        self.now = 5000.0

    def monotonic(self):
        return self.now


@pytest.mark.parametrize("age, held, swept", [
    (120.5, False, True),  # unheld past the TTL: a report whose fetch never came
    (120.0, False, False),  # not past it yet
    (60.0, False, False),
    (500.0, True, False),  # held: its holder releases it
])
def test_unheld_entries_are_swept_after_their_ttl(monkeypatch, age, held, swept):
    clock = Clock()
    monkeypatch.setattr(progress, "time", clock)
    reg = Registry(ReadTrack)
    old = reg.hold("old") if held else reg.get("old")
    clock.now += age
    reg.get("new")  # making an entry sweeps
    assert ("old" in reg.items) is not swept
    assert reg.items.get("old", old) is old


def test_a_read_track_has_a_layer_once_landed_and_the_last_once_verified():
    track = ReadTrack()
    track.layers = 2  # layers 0 and 1 landed
    assert [track.has(layer, False) for layer in range(4)] == [True, True, False, False]
    assert not track.has(1, True)  # landed, but the read's checksums are not in
    track.finish(3)
    assert (track.final, track.final_error, track.opened) == (3, "", 3)
    assert track.has(3, True)


def test_a_fresh_entry_has_no_error_and_no_holder():
    for entry in (ReadTrack(), LayerState()):
        assert (entry.error, entry.holders) == ("", 0)
        entry.fail("gone")
        entry.fail("later")
        assert entry.error == "gone"
