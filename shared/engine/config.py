"""Settings both engine services share (each adds its own in services/<engine>/config.py)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from shared.config import require
from shared.service_config import CommonConfig


@dataclass(frozen=True)
class EngineConfig(CommonConfig):
    engine: str = ""  # engine id; empty = derived from node and pid
    group: str = ""  # engine group (all engines of a node share one); empty = node
    model: str = "smollm2"  # preset (smollm2, tiny), .gguf path, or HF directory
    seed: int = 0  # random-init seed (tiny / random presets)
    dtype: str = "float32"  # model and KV dtype: float32 | bfloat16 | float16
    device: str = "cpu"  # where the model and its KV cache live: cpu | cuda | cuda:N (the TM still reaches a host region)
    kv_mirror: bool = False  # on cpu: keep the KV cache apart from the host region and copy as on a GPU (tests that path)
    kv_blocks: int = 256  # paged KV cache size in blocks
    block_size: int = 64  # tokens per KV block
    threads: int = 0  # torch threads; 0 = torch default
    heap_keep_mb: int = 1024  # freed chunks below this stay in the heap (no page faults per step); 0 = glibc default

    def validate(self) -> None:
        require(self.kv_blocks > 0, "kv_blocks", self.kv_blocks, "must be > 0")
        require(self.block_size > 0 and self.block_size % 8 == 0, "block_size", self.block_size,
                "must be a positive multiple of 8")
        require(self.dtype in ("float32", "bfloat16", "float16"), "dtype", self.dtype,
                "float32, bfloat16 or float16")
        require(re.fullmatch(r"cpu|cuda(:\d+)?", self.device) is not None, "device", self.device,
                "cpu, cuda or cuda:N")
        require(self.threads >= 0, "threads", self.threads, "must be >= 0")
        require(0 <= self.heap_keep_mb <= 2047, "heap_keep_mb", self.heap_keep_mb, "must be in [0, 2047]")
