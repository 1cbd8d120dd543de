"""A peer's later announcement is the same endpoint (regions may be added) or a new process (connect again)."""
from __future__ import annotations

import msgspec
import pytest

from shared.transport.base import EndpointDesc, RegionDesc, same_process

pytestmark = pytest.mark.unit

A = EndpointDesc("shm", "tm-d", "host-1", pid=100, alive="alive-100")


def test_more_regions_is_the_same_endpoint():
    assert same_process(A, msgspec.structs.replace(A, regions=[RegionDesc("buf", 64, 1)]))


@pytest.mark.parametrize("change", [{"pid": 101}, {"alive": "alive-101"}, {"port": 7000}, {"host": "10.0.0.2"},
                                    {"host_id": "host-2"}, {"backend": "tcp"}])
def test_a_restarted_peer_is_a_new_process(change):
    assert not same_process(A, msgspec.structs.replace(A, **change))
