"""Layerwise prefill: the model thread waits for layer l of the stored KV before computing layer l.

`LoadProgress` is fed from the event loop (`LayersLoaded` messages from the
traffic-manager) and read from the model thread; `LayerGate` is the LayerHooks
object passed to `forward`, blocking in `before_layer(l)` until every request of the
batch that loads stored KV has layer l in KV memory.

With the cache on a device apart from the host KV region (shared/engine/kv_device.py) the
gate is also the GPU form of itself: `before_layer(l)` sends every layer that has landed
in the host region up on the copy stream (one event per layer) and makes the compute
stream wait for layer l's event, so the CPU blocks only until the TM wrote layer l and
the GPU only until its copy is done; `after_layer(l)` sends layer l of the blocks this
forward writes down to the host region, and `finish` waits for those copies before the
TM may push them. With one cache for both (CPU) every copy is nothing.
"""
from __future__ import annotations

import threading
import time

from shared.messages.codes import ErrorCode


class LoadError(RuntimeError):
    """Stored KV did not arrive: `req_id`, the `layer` waited for, why, and its `code`."""

    def __init__(self, req_id: str, layer: int, reason: str, code: ErrorCode = ErrorCode.STORAGE):
        super().__init__(f"{req_id}: layer {layer}: {reason}")
        self.req_id, self.layer, self.reason, self.code = req_id, layer, reason, code


class LoadProgress:
    def __init__(self, req_id: str):
        self.req_id = req_id
        self.layers = 0  # layers 0..layers-1 are in KV memory
        self.error = ""
        self.code = ErrorCode.STORAGE  # what failed, once `error` is set
        self.waited_s = 0.0  # time the model thread spent waiting on this request's layers
        self.blocks: list[int] = []  # the KV blocks its loaded layers land in (set once the read reports)
        self.uploaded = 0  # layers 0..uploaded-1 sent up to the device cache (model thread only)
        self.events: list = []  # their copy events, one per layer (None on CPU)
        self._cond = threading.Condition()

    def mark(self, layer: int) -> None:
        with self._cond:
            self.layers = max(self.layers, layer + 1)
            self._cond.notify_all()

    def fail(self, reason: str, code: ErrorCode = ErrorCode.STORAGE) -> None:
        with self._cond:
            self.error, self.code = reason, code
            self._cond.notify_all()

    def wait(self, layer: int, timeout: float) -> None:
        t0 = time.perf_counter()
        with self._cond:
            ok = self._cond.wait_for(lambda: self.layers > layer or self.error, timeout)
        self.waited_s += time.perf_counter() - t0
        if self.error:
            raise LoadError(self.req_id, layer, self.error, self.code)
        if not ok:
            raise LoadError(self.req_id, layer, f"not loaded within {timeout}s")


class LayerGate:
    """LayerHooks for one forward: each loading request's layer in KV memory before it is computed,
    and (device cache) each layer's new KV of `written` blocks sent down once written."""

    def __init__(self, loads: list[LoadProgress], timeout: float, copies=None, written: list[int] = ()):
        self.loads, self.timeout = loads, timeout
        self.copies = copies if copies is not None and copies.separate else None  # a DeviceCopies
        self.written = list(written)

    def before_layer(self, layer: int) -> None:
        for p in self.loads:
            p.wait(layer, self.timeout)
            if self.copies is not None:
                self._upload(p, layer)

    def _upload(self, p: LoadProgress, layer: int) -> None:
        landed = p.layers  # read once: the event loop may mark more meanwhile
        while p.uploaded < landed:
            p.events.append(self.copies.upload(p.blocks, p.uploaded))
            p.uploaded += 1
        self.copies.wait(p.events[layer])

    def after_layer(self, layer: int) -> None:
        if self.copies is not None and self.written:
            self.copies.download(self.written, layer)

    def finish(self) -> None:
        """Every layer this forward wrote is in the host region (the TM may read it now)."""
        if self.copies is not None:
            self.copies.finish()
