"""The bench's prediction takes the data-plane bandwidth its run measured, under the key the transport bench writes."""
from __future__ import annotations

import pytest

from dualpath.bench.predict import DEFAULT_DATA_PLANE, data_plane_bytes_s

pytestmark = pytest.mark.unit


def test_measured_shm_scattered_bandwidth_is_used():
    doc = {"data_plane": {"throughput": {"shm_contiguous_gb_s": 3.0, "shm_scattered_gb_s": 2.5}}}
    assert data_plane_bytes_s(doc) == 2.5e9


def test_default_without_a_data_plane_run():
    assert data_plane_bytes_s({}) == DEFAULT_DATA_PLANE
    assert data_plane_bytes_s({"data_plane": {"isolation": {}}}) == DEFAULT_DATA_PLANE
