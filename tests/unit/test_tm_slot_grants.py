"""The traffic-manager's grants of its buffer slots (services/traffic_manager/slot_grants.py)."""
import pytest

from services.traffic_manager.slot_grants import GrantsGiven, GrantsHeld
from shared.transport import create_endpoint, decode_grant

pytestmark = pytest.mark.unit
BN = 1 << 10


@pytest.fixture
def endpoint():
    ep = create_endpoint("shm", node="de")
    ep.register("buf", bytearray(64 * BN))
    ep.register("kv", bytearray(64 * BN), remote=False)
    yield ep
    ep.close_local()


def test_a_request_gets_exactly_its_slots_and_loses_them_when_freed(endpoint):
    given = GrantsGiven(endpoint)
    raw = given.give("r1", [3 * BN, 4 * BN, 9 * BN], BN)
    g = decode_grant(raw)
    assert (g.region, g.starts, g.ends) == ("buf", [3 * BN, 9 * BN], [5 * BN, 10 * BN])
    assert given.give("r1", [3 * BN, 4 * BN, 9 * BN], BN) == raw  # a Stage after its Reserve: the same grant
    assert endpoint.grants.known(g.token)
    given.take_back("r1")
    assert not endpoint.grants.known(g.token) and len(given) == 0
    given.take_back("r1")  # twice is harmless


def test_new_slots_for_a_request_revoke_its_old_grant(endpoint):
    given = GrantsGiven(endpoint)
    old = decode_grant(given.give("r1", [0], BN))
    new = decode_grant(given.give("r1", [BN], BN))
    assert not endpoint.grants.known(old.token) and endpoint.grants.known(new.token)


def test_held_grants_are_bounded_and_dropped_per_request(endpoint):
    given, held = GrantsGiven(endpoint), GrantsHeld(cap=2)
    for r in ("a", "b", "c"):
        held.keep(r, "d0", given.give(r, [0], BN))
    assert held.get("a", "d0") is None and held.get("c", "d0") is not None and len(held) == 2
    held.drop("c")
    assert held.get("c", "d0") is None and held.keep("x", "d0", b"") is None
