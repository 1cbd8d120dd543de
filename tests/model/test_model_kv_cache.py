"""PagedKVCache byte geometry and zero-copy aliasing of shared buffers."""

from __future__ import annotations

import gc
import mmap
from multiprocessing import shared_memory

import pytest
import torch

from shared.model.config import ModelConfig
from shared.model.kv_cache import PagedKVCache

pytestmark = pytest.mark.model
CFG = ModelConfig(n_layers=3, n_kv_heads=2, head_dim=8)


def test_layer_block_is_contiguous_slice_of_full_block():
    kv = PagedKVCache.allocate(CFG, 5, block_size=4)
    assert kv.layer_block_nbytes == 4 * CFG.kv_bytes_per_token_per_layer == 4 * 2 * 2 * 8 * 4
    assert kv.block_nbytes == 3 * kv.layer_block_nbytes
    assert kv.nbytes == PagedKVCache.nbytes_for(CFG, 5, 4) == kv.data.numel() * 4
    kv.data[3, 1] = 7.0
    raw = kv.data.view(-1).view(torch.uint8).numpy().tobytes()
    lo = kv.layer_block_offset(3, 1)
    assert lo == 3 * kv.block_nbytes + kv.layer_block_nbytes == kv.block_offset(3) + kv.layer_block_nbytes
    want = torch.full((kv.layer_block_nbytes // 4,), 7.0).numpy().tobytes()
    assert raw[lo : lo + kv.layer_block_nbytes] == want
    assert raw[lo - 4 : lo] == bytes(4) and raw[lo + kv.layer_block_nbytes :][:4] == bytes(4)
    assert bytes(kv.layer_block_bytes(3, 1)) == want
    assert bytes(kv.block_bytes(3)) == raw[kv.block_offset(3) :][: kv.block_nbytes]


def test_block_views_write_through_to_the_tensor():
    kv = PagedKVCache.allocate(CFG, 2, block_size=4)
    kv.layer_block_bytes(1, 2)[:4] = torch.tensor([1.5]).numpy().tobytes()
    assert kv.data[1, 2, 0, 0, 0, 0].item() == 1.5


def test_out_of_range_blocks_and_layers_raise():
    kv = PagedKVCache.allocate(CFG, 2, block_size=4)
    with pytest.raises(IndexError):
        kv.block_offset(2)
    with pytest.raises(IndexError):
        kv.layer_block_offset(0, 3)


def test_from_bytearray_aliases_without_copy():
    n = PagedKVCache.nbytes_for(CFG, 3, 4)
    buf = bytearray(n)
    kv = PagedKVCache.from_buffer(buf, CFG, 3, block_size=4)
    kv.data[2, 0, 1, 3, 1, 7] = 2.0
    off = kv.layer_block_offset(2, 0) + ((1 * 4 + 3) * 2 + 1) * 8 * 4 + 7 * 4
    assert buf[off : off + 4] == torch.tensor([2.0]).numpy().tobytes()
    buf[0:4] = torch.tensor([-3.0]).numpy().tobytes()  # and the other way round
    assert kv.data[0, 0, 0, 0, 0, 0].item() == -3.0


def test_from_mmap_and_posix_shm_alias_the_mapping():
    n = PagedKVCache.nbytes_for(CFG, 2, 4)
    with mmap.mmap(-1, n) as m:
        kv = PagedKVCache.from_buffer(m, CFG, 2, block_size=4)
        kv.data[1] = 1.0
        assert m[kv.block_offset(1) : kv.block_offset(1) + 4] == torch.tensor([1.0]).numpy().tobytes()
        del kv
        gc.collect()
    shm = shared_memory.SharedMemory(create=True, size=n)
    try:
        kv = PagedKVCache.from_buffer(shm.buf, CFG, 2, block_size=4)
        other = shared_memory.SharedMemory(name=shm.name)  # a second mapping, as another process would
        kv.data[0, 2] = 5.0
        seen = PagedKVCache.from_buffer(other.buf, CFG, 2, block_size=4)
        assert torch.equal(seen.data[0, 2], torch.full_like(seen.data[0, 2], 5.0))
        del kv, seen
        gc.collect()
        other.close()
    finally:
        shm.close()
        shm.unlink()


def test_from_buffer_refuses_a_short_buffer():
    with pytest.raises(ValueError, match="needed"):
        PagedKVCache.from_buffer(bytearray(100), CFG, 2, block_size=4)
