"""Layerwise prefill: the model thread waits for layer l of the stored KV before computing layer l.

`LoadProgress` is fed from the event loop (`LayersLoaded` messages from the
traffic-manager) and read from the model thread; `LayerGate` is the LayerHooks
object passed to `forward`, blocking in `before_layer(l)` until every request of the
batch that loads stored KV has layer l in KV memory.
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
    """LayerHooks for one forward: wait for each loading request's layer before computing it."""

    def __init__(self, loads: list[LoadProgress], timeout: float):
        self.loads, self.timeout = loads, timeout

    def before_layer(self, layer: int) -> None:
        for p in self.loads:
            p.wait(layer, self.timeout)

    def after_layer(self, layer: int) -> None:
        pass
