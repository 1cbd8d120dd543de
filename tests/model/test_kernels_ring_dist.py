"""Ring attention across real gloo processes equals single-process attention."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kernels import attention as attn
from kernels import partition, ring

pytestmark = pytest.mark.model


def _worker(rank: int, world: int, path: str) -> None:
    # rendezvous through a file, not a TCP port picked in advance (another process could take it)
    dist.init_process_group("gloo", init_method=f"file://{path}/rendezvous", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 4, 24, 8, generator=g) for _ in range(3))
        pos = partition.positions(24, world, "zigzag")
        out, _ = ring.ring_attention_dist(*(partition.split(x, pos, 2)[rank] for x in (q, k, v)), pos[rank])
        torch.save(out, f"{path}/out{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_ring_over_gloo_processes(tmp_path):
    world = 3
    mp.spawn(_worker, args=(world, str(tmp_path)), nprocs=world, join=True)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 24, 8, generator=g) for _ in range(3))
    pos = partition.positions(24, world, "zigzag")
    outs = [torch.load(tmp_path / f"out{r}.pt") for r in range(world)]
    ref = attn.reference(q, k, v, causal=True)[0]
    assert torch.allclose(partition.unsplit(outs, pos, 2), ref, atol=2e-5)
