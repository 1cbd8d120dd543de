"""shared/engine/heap.py: the mallopt plan, and that applying it keeps a freed tensor's pages mapped."""
from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from shared.config import ConfigError
from shared.engine.config import EngineConfig
from shared.engine.heap import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, MIB, plan

pytestmark = pytest.mark.unit


def test_plan_raises_both_thresholds():
    assert plan(256) == {M_MMAP_THRESHOLD: 256 * MIB, M_TRIM_THRESHOLD: 512 * MIB}
    assert plan(0) == {}
    with pytest.raises(ValueError, match="-1"):
        plan(-1)


def test_config_rejects_out_of_range_keep():
    with pytest.raises(ConfigError, match="heap_keep_mb"):
        EngineConfig(heap_keep_mb=4096).validate()
    EngineConfig(heap_keep_mb=0).validate()


# A fresh process runs 8 rounds of a decode step's K/V gather (two 40 MiB index_select
# outputs from a paged cache, freed at the end of the step). glibc's default maps any
# chunk above 32 MiB (the ceiling of its dynamic mmap threshold) fresh and unmaps it on
# free: 2 x 10,200 page faults every round. With keep_freed(64) they come from the heap
# and most rounds reuse pages already mapped.
PROBE = textwrap.dedent("""
    import resource, sys
    from shared.engine.heap import keep_freed
    applied = keep_freed(int(sys.argv[1]))
    import torch
    cache = torch.randn(1024, 12288)  # 1,024 blocks of 48 KiB
    rows = torch.randperm(1024)[:850]
    def step():
        k, v = cache.index_select(0, rows), cache.index_select(0, rows)
        return float(k.sum() + v.sum())
    step()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(8):
        step()
    print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
""")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt and its thresholds are glibc's")
@pytest.mark.parametrize("keep_mb, applied", [(0, False), (64, True)])
def test_keep_freed_serves_step_temporaries_from_the_heap(keep_mb, applied):
    out = subprocess.run([sys.executable, "-c", PROBE, str(keep_mb)], capture_output=True, text=True, check=True)
    got_applied, faults = out.stdout.split()
    assert got_applied == str(applied)
    pages = 8 * 2 * 10200  # 8 rounds, two outputs of 850 x 48 KiB
    if keep_mb:
        assert int(faults) <= pages // 2, f"{faults} page faults over 8 gather rounds"
    else:
        assert int(faults) >= pages * 7 // 8, f"only {faults} page faults: glibc's default changed?"
