"""The data-plane bench runs end to end (small sizes) and reports every figure `dualpath bench --data-plane` prints."""
from __future__ import annotations

import pytest

from shared.transport.bench import figures, lines

pytestmark = pytest.mark.integration


def test_figures_cover_throughput_and_isolation():
    fig = figures(mib=4, samples=5, rounds=1, backends=("shm",))
    t = fig["throughput"]
    assert t["payload_mib"] == 4 and t["piece_kib"] == 96
    for k in ("tcp_gb_s", "raw_socket_gb_s", "shm_gb_s", "memcpy_gb_s"):
        assert t[k] > 0, k
    assert t["tcp_over_raw_time"] == pytest.approx(t["raw_socket_gb_s"] / t["tcp_gb_s"])
    iso = fig["isolation"]["shm"]
    for what in ("one_block_s", "one_layer_s"):
        assert set(iso[what]) == {"idle", "same_link", "other_tm"} and all(v > 0 for v in iso[what].values())
    assert iso["bulk_alone_gb_s"] > 0
    text = "\n".join(lines(fig))
    assert "tcp/raw time ratio" in text and "latency class over shm" in text
