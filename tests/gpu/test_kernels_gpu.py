"""Kernel entry points on CUDA tensors agree with the CPU reference."""
from __future__ import annotations

import pytest
import torch

from kernels import decode

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (no GPU here)")]


def test_split_kv_decode_on_cuda_matches_cpu_reference():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 32, 128, generator=g), torch.randn(9000, 8, 128, generator=g), torch.randn(9000, 8, 128, generator=g)
    out = decode.decode_attention(q.cuda(), k.cuda(), v.cuda(), split_size=1024).cpu()
    assert (out - decode.reference(q, k, v)).abs().max() < 1e-4
