"""Layerwise prefill: the model thread waits for layer l of the stored KV before computing layer l.

A wait fails only once its load made no progress for the timeout. With a device cache the gate
also moves each layer up and down on the copy stream."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from shared.kv.window import layer_blocks
from shared.messages.codes import ErrorCode


class LoadError(RuntimeError):
    """Stored KV did not arrive: `req_id`, the `layer` waited for, why, and its `code`."""

    def __init__(self, req_id: str, layer: int, reason: str, code: ErrorCode = ErrorCode.STORAGE):
        super().__init__(f"{req_id}: layer {layer}: {reason}")
        self.req_id, self.layer, self.reason, self.code = req_id, layer, reason, code


class LoadProgress:
    def __init__(self, req_id: str, window=None):
        self.req_id = req_id
        self.window = window  # HitWindow: the hits' layers land in its ring (None: in `blocks`)
        self.layers = 0  # layers 0..layers-1 are in KV memory
        self.error = ""
        self.code = ErrorCode.STORAGE  # what failed, once `error` is set
        self.waited_s = 0.0  # time the model thread spent waiting on this request's layers
        self.blocks: list[int] = []  # the KV blocks its loaded layers land in (set once the read reports)
        self.uploaded = 0  # layers 0..uploaded-1 sent up to the device cache (model thread only)
        self.events: list = []  # their copy events, one per layer (None on CPU)
        self.moved = time.monotonic()  # the last sign of progress (a layer landed, the read reported)
        self.reading = True  # its storage read is in flight, unreported (event loop only; False: reported or given up)
        self.gone = False  # its traffic manager died: no read or copy of the old one lands (event loop only)
        self._cond = threading.Condition()

    def mark(self, layer: int) -> None:
        with self._cond:
            self.layers = max(self.layers, layer + 1)
            self.moved = time.monotonic()
            self._cond.notify_all()

    def expect(self, eta_s: float) -> None:
        """The read's last layer lands within `eta_s`; no waiter gives up before that."""
        with self._cond:
            self.moved = max(self.moved, time.monotonic() + eta_s)

    def layer_blocks(self, layer: int, n_layers: int) -> list[int]:
        return layer_blocks(self.blocks, layer, n_layers, self.window)

    def fail(self, reason: str, code: ErrorCode = ErrorCode.STORAGE) -> None:
        with self._cond:
            self.error, self.code = reason, code
            self._cond.notify_all()

    def wait(self, layer: int, timeout: float) -> None:
        """Until layer `layer` is in KV memory; LoadError once nothing moved for `timeout` seconds."""
        t0, start = time.perf_counter(), time.monotonic()
        with self._cond:
            while not (self.layers > layer or self.error):
                left = max(start, self.moved) + timeout - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        self.waited_s += time.perf_counter() - t0
        if self.error:
            raise LoadError(self.req_id, layer, self.error, self.code)
        if self.layers <= layer:
            raise LoadError(self.req_id, layer, f"not loaded within {timeout}s of the last progress")


class LayerGate:
    """LayerHooks for one forward: each loading request's layer is in KV memory before it is computed;
    each layer whose new KV is in the host region is reported to `on_computed` (model thread)."""

    def __init__(self, loads: list[LoadProgress], timeout: float, copies=None, written: list[int] = (),
                 on_computed: Callable[[int], None] | None = None):
        self.loads, self.timeout = loads, timeout
        self.copies = copies if copies is not None and copies.separate else None  # a DeviceCopies
        self.written = list(written)
        self.on_computed = on_computed
        self.pending: list[tuple[int, object]] = []  # (layer, its copy-down event) not reported yet
        self.downs: dict[int, object] = {}  # layer -> its copy-down event (device cache)
        self.last_computed_at = 0.0  # perf_counter when the last layer was reported
        self.waited_s = 0.0  # time the forward spent waiting for stored KV to land (not computing)

    def before_layer(self, layer: int) -> None:
        if layer > 0:
            self._done(layer - 1)
        t0 = time.perf_counter()
        for p in self.loads:
            p.wait(layer, self.timeout)
            if self.copies is not None:
                self._upload(p, layer)
        self.waited_s += time.perf_counter() - t0

    def _upload(self, p: LoadProgress, layer: int) -> None:
        landed = p.layers  # read once: the event loop may mark more meanwhile
        while p.uploaded < landed:
            if p.window is None:
                p.events.append(self.copies.upload(p.blocks, p.uploaded))
            else:  # into reused ring slots: after the compute of the layer that used them
                ids = p.layer_blocks(p.uploaded, self.copies.cache.n_layers)
                p.events.append(self.copies.upload_layer_blocks(ids))
            p.uploaded += 1
        self.copies.wait(p.events[layer])

    def after_layer(self, layer: int) -> None:
        if self.copies is not None and self.written:
            self.downs[layer] = self.copies.download(self.written, layer)

    def _done(self, layer: int) -> None:
        """Layer `layer` is over; its attention no longer reads its hits' slots."""
        if self.on_computed is not None:
            self.pending.append((layer, self.downs.pop(layer, None)))
            self._report(wait=False)

    def _report(self, wait: bool) -> None:
        while self.pending:
            layer, event = self.pending[0]
            if event is not None and not wait and not event.query():
                return
            if event is not None and wait:
                event.synchronize()
            self.pending.pop(0)
            self.last_computed_at = time.perf_counter()
            self.on_computed(layer)

    def finish(self, n_layers: int = 0) -> None:
        """Every layer this forward wrote is in the host region (the TM may read it now)."""
        if self.copies is not None:
            self.copies.finish()
        if self.on_computed is not None and n_layers:
            self._done(n_layers - 1)
            self._report(wait=True)
