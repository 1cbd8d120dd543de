"""Grants of region byte ranges (shared/transport/grants.py): ranges, directions, revocation."""
import msgspec
import pytest

from shared.transport import NotGranted, Op
from shared.transport.grants import TOKEN, Grant, GrantTable, check_grant, coalesce, decode_grant, encode_grant

pytestmark = pytest.mark.unit


def test_ranges_are_sorted_and_touching_ones_merge():
    assert coalesce([(300, 100), (0, 100), (100, 50), (400, 0), (120, 10)]) == ([0, 300], [150, 400])


def test_a_grant_covers_only_its_ranges_and_directions():
    t = GrantTable()
    view = memoryview(bytearray(1000))
    g = t.add("buf", 1000, view, [(100, 100), (500, 100)], read=True, write=False)
    assert len(g.token) == TOKEN and g.covers(100, 100, False) and g.covers(550, 50, False)
    assert not g.covers(99, 2, False) and not g.covers(150, 400, False) and not g.covers(100, 10, True)
    assert len(t.view(g.token, 500, 100, False)) == 100
    for off, n, write in ((0, 1, False), (590, 20, False), (100, 1, True)):
        with pytest.raises(NotGranted):
            t.view(g.token, off, n, write)
    assert t.revoke(g.token) and not t.known(g.token)
    with pytest.raises(NotGranted, match="no live grant"):
        t.view(g.token, 100, 1, False)


def test_the_server_checks_its_own_copy_not_the_ranges_a_peer_claims():
    t = GrantTable()
    g = t.add("buf", 1000, memoryview(bytearray(1000)), [(0, 10)], True, True)
    forged = msgspec.structs.replace(g, ends=[1000])
    check_grant("de", forged, [Op("kv", 0, "buf", 500, 10)], True)  # the forger's own check passes
    with pytest.raises(NotGranted):
        t.view(forged.token, 500, 10, True)


def test_a_grant_outside_the_region_is_refused_and_none_covers_all():
    t = GrantTable()
    with pytest.raises(NotGranted):
        t.add("buf", 100, memoryview(bytearray(100)), [(50, 51)], True, True)
    whole = t.add("buf", 100, memoryview(bytearray(100)), None, True, True)
    assert (whole.starts, whole.ends) == ([0], [100])


def test_grants_ride_the_bus_as_bytes():
    g = Grant(b"t" * TOKEN, "buf", [0], [64], read=False)
    assert decode_grant(encode_grant(g)) == g and encode_grant(None) == b"" and decode_grant(b"") is None


def test_a_connection_reaches_a_grant_only_through_a_handle_it_bound():
    from shared.transport.grants import MAX_HANDLES, Bindings, Handles

    t = GrantTable()
    g = t.add("buf", 100, memoryview(bytearray(100)), None, True, True)
    b, h = Bindings(t), Handles()
    handle, new = h.of(g.token)
    assert new and h.of(g.token) == (handle, False)  # bound once per connection
    with pytest.raises(NotGranted, match="no live grant"):
        b.view(handle, 0, 1, False)  # not bound on this connection yet
    b.bind(handle, g.token)
    assert len(b.view(handle, 0, 100, True)) == 100
    for i in range(MAX_HANDLES + 1):  # a flood of bindings of dead tokens is forgotten, live ones kept
        b.bind(10_000 + i, bytes(TOKEN))
    assert len(b.view(handle, 0, 1, False)) == 1
    t.revoke(g.token)
    with pytest.raises(NotGranted):
        b.view(handle, 0, 1, False)
