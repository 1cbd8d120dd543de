"""The model thread: every forward of an engine runs here, off the event loop.

One thread, so an engine's steps never overlap; torch releases the GIL, so the loop keeps serving.
"""
from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from shared.engine.heap import keep_freed

T = TypeVar("T")


class ModelWorker:
    def __init__(self, threads: int = 0, heap_keep_mb: int = 0):
        keep_freed(heap_keep_mb)  # heap.py: step temporaries reuse mapped pages
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
        if threads > 0:
            self.pool.submit(_set_threads, threads).result()

    async def run(self, fn: Callable[..., T], *args, **kwargs) -> T:
        call = functools.partial(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self.pool, call)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
