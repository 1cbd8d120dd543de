"""The traffic-manager's push (PE side): a prompt's KV from the engine's KV memory to a decode engine's buffer.

Whole, or layer by layer while the final forward computes; `PushDone` only once the last layer
landed. A Release or Cancel of the request answers `PushDone(ok=False)` at once."""
from __future__ import annotations

import time

from opentelemetry import trace

from services.traffic_manager.parts import TMParts
from services.traffic_manager.progress import LayerState
from services.traffic_manager.transfers import TransferKind
from services.traffic_manager.transfers import TransferState as T
from shared.bus import BusError, Delivery, error_code
from shared.kv.window import HitWindow
from shared.messages.codes import ErrorCode
from shared.messages.endpoints import EP
from shared.messages.traffic_manager import PushDone, PushKV, Reserve
from shared.transport.base import Op, TrafficClass
from shared.transport.grants import Grant, decode_grant

tracer = trace.get_tracer("traffic_manager")
NOT_ATTACHED = "engine KV memory not attached yet"
LAYER_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class PushPath:
    def __init__(self, parts: TMParts, m_xfer):
        self.p = parts
        self.m_xfer = m_xfer  # dualpath_traffic_manager_transfer_seconds{kind}
        self.m_layer = parts.metrics.histogram("push_layer_seconds", "One layer of a layerwise push, on the data plane",
                                               buckets=LAYER_BUCKETS)

    async def push(self, msg: PushKV, d: Delivery, state: LayerState | None) -> None:
        p = self.p
        pool = p.pool
        t0 = time.perf_counter()
        with tracer.start_as_current_span("kv_transfer", context=d.ctx, attributes={
                "req_id": msg.req_id, "dst_engine": msg.dst_engine, "blocks": len(msg.src_blocks),
                "transport": p.cfg.transport, "layerwise": msg.layerwise}) as span, \
                p.xfers.begin(TransferKind.PUSH, msg.req_id, T.COPYING if msg.dst_slots else T.RESERVING) as t:
            try:
                if not pool.ready:
                    raise BusError("push", NOT_ATTACHED, ErrorCode.NOT_READY)
                slots, grant, adopted = self._held(msg) if msg.dst_slots else await self._reserve(msg)
                p.xfers.move(t, T.COPYING)
                skip = set(msg.skip) | set(range(adopted))  # blocks whose stored KV is already in the DE buffer
                send = [(i, slot) for i, slot in enumerate(slots[:len(msg.src_blocks)]) if i not in skip]
                span.set_attributes({"blocks_sent": len(send), "blocks_skipped": len(skip), "blocks_adopted": adopted})
                peer = await p.peer(msg.dst_engine) if send else None
                if msg.layerwise or msg.window is not None:
                    await self._layers(msg, send, peer, grant, state, span)
                elif send:
                    bn = pool.block_nbytes
                    ops = [Op("kv", msg.src_blocks[i] * bn, "buf", slot, bn) for i, slot in send]
                    await peer.write(ops, TrafficClass.LATENCY, timeout=p.cfg.transfer_timeout_s, grant=grant)
            except Exception as exc:  # noqa: BLE001 - BusError, transport errors, a failed state: the push ends
                t.error = exc
                span.record_exception(exc)
                if state is not None:  # a fetch waiting to reuse a window's slots learns it now
                    state.fail(f"push failed: {exc}")
                released = isinstance(exc, RuntimeError) and not isinstance(exc, BusError)  # the state failed
                code = ErrorCode.CANCELLED if released else error_code(exc, ErrorCode.KV_TRANSFER)
                await d.respond(PushDone(ok=False, error=str(exc), code=code))
                return
            finally:
                p.held.drop(msg.req_id)  # the last transfer this TM makes for the request
            nbytes = pool.block_nbytes * len(send)
            span.set_attribute("bytes", nbytes)
        dt = time.perf_counter() - t0
        p.m_bytes.labels("pd_push").inc(nbytes)
        self.m_xfer.labels("pd_push").observe(dt)
        await d.respond(PushDone(slots=slots, nbytes=nbytes, seconds=dt))

    def _held(self, msg: PushKV) -> tuple[list[int], Grant, int]:
        """DE read path: the slots and their grant came with the staged hits."""
        grant = self.p.held.get(msg.req_id, msg.dst_engine)
        if grant is None:
            raise BusError("push", f"no data-plane grant held for {msg.dst_engine}'s slots of {msg.req_id}",
                           ErrorCode.KV_TRANSFER)
        return msg.dst_slots, grant, 0

    async def _reserve(self, msg: PushKV) -> tuple[list[int], Grant | None, int]:
        """The prompt's DE-buffer slots, adopted prefetch first: (slots, grant, blocks adopted)."""
        p = self.p
        ask = Reserve(msg.req_id, len(msg.src_blocks), adopt=msg.adopt, adopt_block_keys=msg.adopt_block_keys)
        res = await p.bus.request(p.subjects.at(EP.TM_RESERVE, engine=msg.dst_engine), ask,
                                  timeout=p.cfg.transfer_timeout_s, abort=p.peers_gone.future(msg.dst_engine))
        if not res.ok:
            raise BusError("reserve", res.error, res.code)
        p.m_bytes.labels("prefetch_used").inc(res.adopted * p.pool.block_nbytes)
        return res.slots, decode_grant(res.grant), res.adopted

    async def _layers(self, msg: PushKV, send: list[tuple[int, int]], peer, grant: Grant | None,
                      state: LayerState | None, span) -> None:
        """Each layer as soon as it is computed (or at once, when not layerwise)."""
        p, lay = self.p, self.p.pool.layout
        lb, n_layers, timeout = lay.layer_block_nbytes, lay.n_layers, p.cfg.transfer_timeout_s
        window = HitWindow.of(msg.window, n_layers)
        for layer in range(n_layers):
            if state is not None and msg.layerwise:
                await state.until(lambda: state.computed > layer, timeout, f"layer {layer} computed")
            t0 = time.perf_counter()
            if send:
                ops = [Op("kv", _src(msg, i, layer, n_layers, window) * lb, "buf", slot + layer * lb, lb)
                       for i, slot in send]
                await peer.write(ops, TrafficClass.LATENCY, timeout=timeout, grant=grant)
            self.m_layer.observe(time.perf_counter() - t0)
            if state is not None:
                state.pushed = layer + 1
                state.note()
            if layer == 0 or layer == n_layers - 1:
                span.add_event("layer_pushed", {"layer": layer})


def _src(msg: PushKV, i: int, layer: int, n_layers: int, window: HitWindow | None) -> int:
    if window is not None and i < window.in_ring:
        return window.layer_block(i, layer)
    return msg.src_blocks[i] * n_layers + layer
