"""PagedKVCache: the engine's KV memory as one tensor of fixed-size blocks.

Layout: data[block, layer, kv, row, kv_head, dim] with kv 0 = K, 1 = V (for MLA the two
planes hold the latent row split in halves: ModelConfig.kv_cache_container). One block's
KV for all layers (a Full Block's payload) is one contiguous byte range, and one layer
of one block (a Layer Block) is a contiguous sub-range of it, so the data plane moves
either with a single memcpy / RDMA write at `block_offset` / `layer_block_offset`.

Owns the memory and its byte geometry only; which blocks are free is the allocator's
business (shared/kv), which block holds which position is the block table's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared.model.config import ModelConfig


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype named by ModelConfig.dtype."""
    return getattr(torch, name)


@dataclass
class PagedKVCache:
    data: torch.Tensor  # (num_blocks, n_layers, 2, block_size, n_kv_heads, head_dim)
    block_size: int

    @classmethod
    def allocate(cls, cfg: ModelConfig, num_blocks: int, block_size: int = 64,
                 device: torch.device | str | None = None) -> PagedKVCache:
        """A zeroed cache in ordinary memory of `device` (default: the CPU's)."""
        shape = cls.shape_for(cfg, num_blocks, block_size)
        return cls(torch.zeros(shape, dtype=torch_dtype(cfg.dtype), device=device), block_size)

    @classmethod
    def from_buffer(cls, buf, cfg: ModelConfig, num_blocks: int, block_size: int = 64) -> PagedKVCache:
        """A cache that aliases `buf` (bytearray, memoryview, mmap) without copying.

        Writes through `data` land in `buf` and vice versa. The caller keeps `buf`
        (and whatever mapped it) alive for as long as the cache is used.
        """
        shape = cls.shape_for(cfg, num_blocks, block_size)
        count = 1
        for d in shape:
            count *= d
        if len(memoryview(buf).cast("B")) < count * cfg.itemsize:
            raise ValueError(f"buffer of {len(memoryview(buf).cast('B'))} bytes < {count * cfg.itemsize} needed")
        flat = torch.frombuffer(buf, dtype=torch_dtype(cfg.dtype), count=count)
        return cls(flat.view(shape), block_size)

    @staticmethod
    def shape_for(cfg: ModelConfig, num_blocks: int, block_size: int) -> tuple[int, ...]:
        heads, dim = cfg.kv_cache_container
        return (num_blocks, cfg.n_layers, 2, block_size, heads, dim)

    @staticmethod
    def nbytes_for(cfg: ModelConfig, num_blocks: int, block_size: int = 64) -> int:
        """Bytes a buffer must have to hold `num_blocks` blocks (for sizing shm)."""
        return num_blocks * block_size * cfg.kv_bytes_per_token

    @property
    def num_blocks(self) -> int:
        return self.data.shape[0]

    @property
    def n_layers(self) -> int:
        return self.data.shape[1]

    @property
    def layer_block_nbytes(self) -> int:
        """Bytes of one layer of one block (K then V)."""
        return self.data[0, 0].numel() * self.data.element_size()

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block, all layers."""
        return self.n_layers * self.layer_block_nbytes

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.block_nbytes

    def block_offset(self, block: int) -> int:
        """Byte offset of `block` from the start of the buffer."""
        self._check_block(block)
        return block * self.block_nbytes

    def layer_block_offset(self, block: int, layer: int) -> int:
        """Byte offset of layer `layer` of `block` from the start of the buffer."""
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} not in [0, {self.n_layers})")
        return self.block_offset(block) + layer * self.layer_block_nbytes

    def layer_view(self, layer: int) -> torch.Tensor:
        """(num_blocks, 2, block_size, n_kv_heads, head_dim) view of one layer."""
        return self.data[:, layer]

    def layer_blocks(self) -> torch.Tensor:
        """(num_blocks * n_layers, 2, block_size, n_kv_heads, head_dim): every Layer Block, numbered
        block * n_layers + layer (how a forward with hit windows addresses the cache)."""
        return self.data.view(self.num_blocks * self.n_layers, *self.data.shape[2:])

    def block_bytes(self, block: int) -> memoryview:
        """The bytes of one Full Block's payload, aliasing the cache (no copy)."""
        return self._bytes()[self.block_offset(block):][: self.block_nbytes]

    def layer_block_bytes(self, block: int, layer: int) -> memoryview:
        """The bytes of one Layer Block, aliasing the cache (no copy)."""
        return self._bytes()[self.layer_block_offset(block, layer):][: self.layer_block_nbytes]

    def _bytes(self) -> memoryview:
        # uint8 view of the same storage; numpy exposes it as a writable buffer.
        if self.data.device.type != "cpu":
            raise ValueError(f"a cache on {self.data.device} has no host bytes: copy blocks to the host region first")
        return memoryview(self.data.view(-1).view(torch.uint8).numpy()).cast("B")

    def _check_block(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise IndexError(f"block {block} not in [0, {self.num_blocks})")
