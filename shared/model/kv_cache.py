"""PagedKVCache: the engine's KV memory as one tensor of fixed-size blocks.

data[block, layer, kv, row, kv_head, dim]: a Full Block, and each Layer Block in it, is contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared.model.config import ModelConfig


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


@dataclass
class PagedKVCache:
    data: torch.Tensor  # (num_blocks, n_layers, 2, block_size, n_kv_heads, head_dim)
    block_size: int

    @classmethod
    def allocate(cls, cfg: ModelConfig, num_blocks: int, block_size: int = 64,
                 device: torch.device | str | None = None) -> PagedKVCache:
        shape = cls.shape_for(cfg, num_blocks, block_size)
        return cls(torch.zeros(shape, dtype=torch_dtype(cfg.dtype), device=device), block_size)

    @classmethod
    def from_buffer(cls, buf, cfg: ModelConfig, num_blocks: int, block_size: int = 64) -> PagedKVCache:
        """A cache aliasing `buf` without copying; the caller keeps `buf` alive while it is used."""
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
        return num_blocks * block_size * cfg.kv_bytes_per_token

    @property
    def num_blocks(self) -> int:
        return self.data.shape[0]

    @property
    def n_layers(self) -> int:
        return self.data.shape[1]

    @property
    def layer_block_nbytes(self) -> int:
        return self.data[0, 0].numel() * self.data.element_size()

    @property
    def block_nbytes(self) -> int:
        return self.n_layers * self.layer_block_nbytes

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.block_nbytes

    def block_offset(self, block: int) -> int:
        self._check_block(block)
        return block * self.block_nbytes

    def layer_block_offset(self, block: int, layer: int) -> int:
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} not in [0, {self.n_layers})")
        return self.block_offset(block) + layer * self.layer_block_nbytes

    def layer_view(self, layer: int) -> torch.Tensor:
        return self.data[:, layer]

    def layer_blocks(self) -> torch.Tensor:
        """Every Layer Block, numbered block * n_layers + layer: (num_blocks * n_layers, 2, bs, heads, dim)."""
        return self.data.view(self.num_blocks * self.n_layers, *self.data.shape[2:])

    def block_bytes(self, block: int) -> memoryview:
        """The bytes of one Full Block's payload, aliasing the cache (no copy)."""
        return self._bytes()[self.block_offset(block):][: self.block_nbytes]

    def layer_block_bytes(self, block: int, layer: int) -> memoryview:
        return self._bytes()[self.layer_block_offset(block, layer):][: self.layer_block_nbytes]

    def _bytes(self) -> memoryview:
        # uint8 view of the same storage; numpy exposes it as a writable buffer.
        if self.data.device.type != "cpu":
            raise ValueError(f"a cache on {self.data.device} has no host bytes: copy blocks to the host region first")
        return memoryview(self.data.view(-1).view(torch.uint8).numpy()).cast("B")

    def _check_block(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise IndexError(f"block {block} not in [0, {self.num_blocks})")
