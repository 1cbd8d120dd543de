"""Copies between an engine's host KV region and its KV cache on the device.

On CPU the region is the cache and every copy is nothing (`separate` is False). On CUDA, or on
CPU with `kv_mirror`, stored KV goes up layer by layer on a copy stream the forward waits on,
and new KV comes down before the traffic-manager moves it.
"""
from __future__ import annotations

import torch

from shared.model.kv_cache import PagedKVCache


class DeviceCopies:
    def __init__(self, host: PagedKVCache, cache: PagedKVCache):
        self.host, self.cache = host, cache
        self.separate = cache.data.data_ptr() != host.data.data_ptr()
        self.cuda = cache.data.device.type == "cuda"
        self.stream = torch.cuda.Stream(cache.data.device) if self.cuda else None
        self._pinned = False
        if self.cuda:
            self._pin()

    def upload(self, blocks: list[int], layer: int | None = None) -> torch.cuda.Event | None:
        """Host -> device copies of `blocks` (one layer, or all); the event the forward waits on."""
        return self._copy(self.cache.data, self.host.data, blocks, layer, after_compute=False)

    def upload_layer_blocks(self, layer_blocks: list[int]) -> torch.cuda.Event | None:
        """Host -> device copies of Layer Blocks by number, after the compute queued so far."""
        if not self.separate or not layer_blocks:
            return None
        dst, src = self.cache.layer_blocks(), self.host.layer_blocks()
        if self.stream is None:
            for lb in layer_blocks:
                dst[lb].copy_(src[lb])
            return None
        self.stream.wait_stream(torch.cuda.current_stream(self.cache.data.device))
        with torch.cuda.stream(self.stream):
            for lb in layer_blocks:
                dst[lb].copy_(src[lb], non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        return done

    def download(self, blocks: list[int], layer: int | None = None) -> torch.cuda.Event | None:
        """Device -> host copies of `blocks`, after everything the compute stream has queued so far."""
        return self._copy(self.host.data, self.cache.data, blocks, layer, after_compute=True)

    def wait(self, event: torch.cuda.Event | None) -> None:
        """The compute stream waits for `event` (a copy) before its next work; the CPU does not."""
        if event is not None:
            torch.cuda.current_stream(self.cache.data.device).wait_event(event)

    def finish(self) -> None:
        """Block until every copy and compute issued so far is done: its bytes may move, its blocks be freed."""
        if self.stream is not None:
            torch.cuda.current_stream(self.cache.data.device).synchronize()
            self.stream.synchronize()

    def close(self) -> None:
        if self._pinned:
            self.finish()
            torch.cuda.cudart().cudaHostUnregister(self.host.data.data_ptr())
            self._pinned = False

    def _copy(self, dst: torch.Tensor, src: torch.Tensor, blocks: list[int], layer: int | None,
              after_compute: bool) -> torch.cuda.Event | None:
        if not self.separate or not blocks:
            return None
        if self.stream is None:  # CPU mirror: synchronous copies, nothing to wait for
            for sl in _slabs(blocks, layer):
                dst[sl].copy_(src[sl])
            return None
        if after_compute:
            self.stream.wait_stream(torch.cuda.current_stream(self.cache.data.device))
        with torch.cuda.stream(self.stream):
            for sl in _slabs(blocks, layer):
                dst[sl].copy_(src[sl], non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        return done

    def _pin(self) -> None:
        data = self.host.data
        err = torch.cuda.cudart().cudaHostRegister(data.data_ptr(), data.numel() * data.element_size(), 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of the host KV region failed: error {int(err)}")
        self._pinned = True


def _slabs(blocks: list[int], layer: int | None):
    if layer is not None:
        return [(b, layer) for b in blocks]
    out, ordered = [], sorted(set(blocks))
    start = prev = ordered[0]
    for b in ordered[1:]:
        if b != prev + 1:
            out.append((slice(start, prev + 1),))
            start = b
        prev = b
    out.append((slice(start, prev + 1),))
    return out
