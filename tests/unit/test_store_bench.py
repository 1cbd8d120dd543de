"""The storage read bench runs end to end on a small store and prints every figure
and the gateway / dd ratios; bad arguments are refused naming the value."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from services.storage_gateway import bench

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(shutil.which("dd") is None, reason="dd not installed"),
]


def test_a_small_run_reports_every_line_and_ratio(tmp_path: Path) -> None:
    figs, n_blocks = bench.measure(tmp_path, mib=16, threads=2, rounds=2)
    assert n_blocks == 2
    for name, rates in figs.samples.items():
        expected = 1 if "O_DIRECT" in name else 2
        assert len(rates) == expected and min(rates) > 0, name
    assert {n for n in figs.samples if "O_DIRECT" not in n} >= {
        "warm  dd bs=4M",
        "warm  gateway, 1 block/request, reused slot",
        "warm  same, hashed on the reading thread",
        "warm  same, every read on a thread",
        "warm  gateway, 1 request, big buffer",
        "cold  dd bs=4M",
        "cold  gateway, 1 request, big buffer",
    }
    text = bench.report(figs, n_blocks, 2, 2, tmp_path)
    ratios = re.findall(r"gateway / (?:dd|plain preadv) (\d+\.\d+)x \[(\d+\.\d+)x\]", text)
    assert len(ratios) == 6 and all(float(b) > 0 and float(m) > 0 for b, m in ratios)
    assert set(figs.cpu) == {"warm  dd bs=4M", "warm  gateway, 1 block/request, reused slot",
                             "warm  same, hashed on the reading thread", "warm  same, every read on a thread",
                             "warm  gateway, 1 request, big buffer", "warm  plain preadv into big buffer, 1 thread"}
    assert all(len(v) == 2 and min(v) >= 0 for v in figs.cpu.values())
    assert len(re.findall(r"CPU ms/GB \((\d+\.\d+)x dd's\)", text)) == 6


def test_a_bad_count_is_refused_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "0"])
    assert "--rounds must be >= 1, got 0" in capsys.readouterr().err
