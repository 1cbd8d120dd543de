"""The data-plane bench runs end to end (small sizes) and reports every figure `dualpath bench --data-plane` prints."""
from __future__ import annotations

import pytest

from shared.transport.bench import figures, lines

pytestmark = pytest.mark.integration


def test_figures_cover_throughput_and_isolation():
    fig = figures(mib=4, samples=5, rounds=1, backends=("shm",), tp_rounds=2)
    t = fig["throughput"]
    assert t["payload_mib"] == 3 and t["piece_kib"] == 96 and t["rounds"] == 2  # 42 whole pieces
    for lay in ("contiguous", "scattered"):
        for k in (f"tcp_{lay}_gb_s", "raw_socket_gb_s", f"shm_{lay}_gb_s", f"memcpy_{lay}_gb_s",
                  f"tcp_{lay}_over_raw_time", f"shm_{lay}_over_memcpy_time"):
            assert t[k] > 0, k
        assert t[f"tcp_{lay}_over_raw_cpu"] > 0 and t[f"shm_{lay}_over_memcpy_cpu"] > 0
    assert set(t["cpu_ms"]) == {"raw", "tcp_contiguous", "tcp_scattered", "memcpy_contiguous", "memcpy_scattered",
                                "shm_contiguous", "shm_scattered"}
    assert len(t["loadavg_before"]) == 3
    iso = fig["isolation"]["shm"]
    for what in ("one_block_s", "one_layer_s"):
        assert set(iso[what]) == {"idle", "same_link", "other_tm"} and all(v > 0 for v in iso[what].values())
    assert iso["bulk_alone_gb_s"] > 0
    text = "\n".join(lines(fig))
    assert "tcp/raw time ratio" in text and "latency class over shm" in text
    assert "scattered  shm backend" in text and "load average" in text and "CPU of this process" in text


def test_the_host_floor_times_both_pulls_idle_and_beside_bulk_and_stops_its_processes():
    import multiprocessing as mp

    fig = figures(mib=4, samples=6, rounds=1, backends=(), with_throughput=False, floor=True)
    f = fig["floor"]["figures"]
    assert set(f) == {"memcpy", "socket"}
    for rows in f.values():
        assert set(rows) == {"one block", "layer of 16"}
        assert all(v["idle"] > 0 and v["busy"] > 0 for v in rows.values())
    text = "\n".join(lines(fig))
    assert "host floor" in text and "beside bulk" in text
    assert not mp.active_children()  # the pull server and the bulk pair are gone
