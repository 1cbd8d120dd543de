"""An engine's KV memory: a paged KV cache living in POSIX shared memory.

The engine computes into it; its traffic-manager attaches the same segment (named in
the engine's announcement) and moves bytes in and out (local H2D/D2H, PD transfer).
Owns the segment, the cache view and the block allocator; not the model.
"""
from __future__ import annotations

from shared.kv.allocator import SlotAllocator
from shared.messages.registry import KVRegion
from shared.model.config import ModelConfig
from shared.model.kv_cache import PagedKVCache
from shared.transport.shm_region import ShmRegion, new_name, reap_orphans


class KVMemory:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, tag: str = "kv"):
        reap_orphans()  # a predecessor killed with -9 left its KV memory behind
        size = PagedKVCache.nbytes_for(cfg, num_blocks, block_size)
        self.region = ShmRegion.create(new_name(tag), size)
        self.cache = PagedKVCache.from_buffer(self.region.buf, cfg, num_blocks, block_size)
        self.alloc = SlotAllocator(num_blocks)
        self.block_size = block_size
        c = self.cache
        self._layout = KVRegion(shm_name=self.region.name, num_blocks=c.num_blocks, block_size=c.block_size,
                                n_layers=c.n_layers, block_nbytes=c.block_nbytes,
                                layer_block_nbytes=c.layer_block_nbytes)

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def layout(self) -> KVRegion:
        return self._layout

    def close(self) -> None:
        self.cache = None  # drop the tensor view before unmapping
        try:
            self.region.close()
        except BufferError:
            pass  # a view is still alive in a worker thread; the unlink below still frees the name
        self.region.unlink()
