"""An engine's KV memory: its paged KV cache and the host region its traffic-manager reaches."""
from __future__ import annotations

from shared.engine.kv_device import DeviceCopies
from shared.kv.allocator import SlotAllocator
from shared.messages.registry import KVRegion
from shared.model.config import ModelConfig
from shared.model.kv_cache import PagedKVCache
from shared.transport.shm_region import ShmRegion, new_name, reap_orphans


class KVMemory:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, tag: str = "kv", device: str = "cpu",
                 mirror: bool = False):
        reap_orphans()  # a predecessor killed with -9 left its KV memory behind
        size = PagedKVCache.nbytes_for(cfg, num_blocks, block_size)
        self.region = ShmRegion.create(new_name(tag), size)
        self.host = PagedKVCache.from_buffer(self.region.buf, cfg, num_blocks, block_size)
        apart = mirror or device != "cpu"
        self.cache = PagedKVCache.allocate(cfg, num_blocks, block_size, device) if apart else self.host
        self.copies = DeviceCopies(self.host, self.cache)
        self.alloc = SlotAllocator(num_blocks)
        self.block_size = block_size
        c = self.host
        self._layout = KVRegion(shm_name=self.region.name, num_blocks=c.num_blocks, block_size=c.block_size,
                                n_layers=c.n_layers, block_nbytes=c.block_nbytes,
                                layer_block_nbytes=c.layer_block_nbytes)

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def layout(self) -> KVRegion:
        return self._layout

    def close(self) -> None:
        self.copies.close()
        self.cache = self.host = self.copies = None  # drop the tensor views before unmapping
        try:
            self.region.close()
        except BufferError:
            pass  # a view is still alive in a worker thread; the unlink below still frees the name
        self.region.unlink()
