"""The copies between an engine's host KV region and its KV cache on the compute device.

The traffic-manager reaches host memory only: the engine's KV region in POSIX shared memory
(kv_memory.py). On CPU that region is the very cache the model computes into, and every
copy here is nothing (`separate` is False). On CUDA the cache is a second tensor on the
device (so is it on CPU with `kv_mirror`, which runs the device path's copies without a GPU),
and the engine moves bytes between the two at four points:

- stored KV the TM wrote into the host region goes up layer by layer (`upload(blocks,
  layer)`; hits in a window by Layer Block, `upload_layer_blocks`, after the compute that
  used those ring slots) on the copy stream, one event per layer; the forward's compute
  stream waits on layer l's event before layer l reads it (`wait`): the GPU form of the
  prefill engine's LayerGate;
- a prompt the decode engine received goes up whole before the sequence joins;
- a prefill's new KV goes down layer by layer right after each layer wrote it (`download`
  waits for the compute stream's work so far), finished before the TM pushes it;
- a decode block that filled goes down before the TM persists it.

The host region is page-locked (cudaHostRegister) so the copies are asynchronous DMA. Each
(block, layer) slab is contiguous in both tensors; whole-block copies of consecutive blocks
are one copy per run. On CPU every copy is a synchronous `copy_` and there are no events.
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
        """Host -> device copies of Layer Blocks by number (block * n_layers + layer: a hit window's
        ring), after everything the compute stream has queued so far (the slots are being reused)."""
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
        """Block until every copy and compute issued so far is done: the TM may move the bytes, and
        blocks freed after this are touched by nothing still in flight."""
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
        """Page-lock the host region in place (it is shared memory the TM also maps)."""
        data = self.host.data
        err = torch.cuda.cudart().cudaHostRegister(data.data_ptr(), data.numel() * data.element_size(), 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of the host KV region failed: error {int(err)}")
        self._pinned = True


def _slabs(blocks: list[int], layer: int | None):
    """Index tuples of contiguous slabs: one per (block, layer), or one per run of consecutive
    blocks when all layers move."""
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
