"""A region dropped from an endpoint's table is gone everywhere (name, peers' id, array cache) and its name can be taken again."""
from __future__ import annotations

import pytest

from shared.transport.errors import RegionNotFound
from shared.transport.regions import RegionTable

pytestmark = pytest.mark.unit


def test_a_dropped_region_is_gone_and_its_name_is_free_again():
    t = RegionTable()
    t.add("buf", bytearray(64))
    first = t.add("kv", bytearray(b"\x01" * 32), remote=False)
    assert t.array("kv")[0] == 1  # cached
    assert t.drop("kv") == 1  # its position among descs()
    with pytest.raises(RegionNotFound):
        t.resolve("kv", 0, 1)
    again = t.add("kv", bytearray(b"\x02" * 16), remote=False)
    assert again.rid != first.rid and again.size == 16
    assert t.array("kv")[0] == 2 and len(t.array("kv")) == 16  # not the old cached array
    assert [d.name for d in t.descs()] == ["buf", "kv"]


def test_a_dropped_remote_region_can_no_longer_be_granted():
    t = RegionTable()
    t.add("buf", bytearray(64))
    t.drop("buf")
    assert t.remote_descs() == []
    with pytest.raises(RegionNotFound):
        t.remote_view("buf")
    with pytest.raises(RegionNotFound):
        t.drop("buf")
