"""Persistence from the decode side: every full block is saved the moment it fills.

Prompt blocks the store lacks are saved from the DE buffer on admission, generated ones from KV
memory; the engine keeps a block until the TM copied it out. Never stalls a decode step, and
never holds the engine itself (only the bus and callbacks)."""
from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Callable

from services.decode_engine.running import RunningSeq
from shared.bus import Bus, BusError, Losses
from shared.engine.requests import EngineRequest
from shared.kv.hashing import chain_hash
from shared.messages.storage_gateway import StoreLayout
from shared.messages.traffic_manager import SaveKV
from shared.messages.work import DecodeAdmit
from shared.metrics import Metrics

log = logging.getLogger("decode_engine.persist")


class Persister:
    def __init__(self, layout: StoreLayout, node: str, bus: Bus, subject: str, timeout_s: float,
                 spawn: Callable[..., asyncio.Task], metrics: Metrics, *,
                 release: Callable[[EngineRequest], None], on_failure: Callable[[EngineRequest, str], None]):
        self.layout, self.node, self.bus, self.subject, self.timeout_s = layout, node, bus, subject, timeout_s
        self.spawn, self.release, self.on_failure = spawn, release, on_failure
        self.tm = Losses()  # resolves when the engine's TM is gone: a save waiting on it fails at once
        self.pending: Counter[str] = Counter()  # req_id -> saves not yet copied out
        self.deferred: dict[str, EngineRequest] = {}  # released while saves were pending: released after them
        self.m_saved = metrics.counter("persisted_blocks_total", "Full blocks handed to persistence")
        self.m_failed = metrics.counter("persist_failures_total", "Saves that failed unexpectedly")

    async def claim_prompt(self, req: EngineRequest, admit: DecodeAdmit) -> str:
        """On admission: save the prompt's missing blocks from the buffer slots they arrived in. Returns
        why it could not ("" when claimed or nothing to save); then the PE persists the prompt."""
        n_full = min(admit.prompt_len // self.layout.block_size, len(admit.block_keys), len(admit.buf_slots))
        start = min(admit.persisted_blocks, n_full)
        if start >= n_full:
            return ""
        msg = SaveKV(req.req_id, [], list(admit.block_keys[start:n_full]), self.node, self.layout,
                     slots=list(admit.buf_slots[start:n_full]))
        try:
            res = await self.bus.request(self.subject, msg, timeout=self.timeout_s, ctx=req.ctx,
                                         abort=self.tm.current())
        except BusError as exc:
            return exc.reason
        self.m_saved.inc(res.copied)
        return res.error

    def prompt(self, seq: RunningSeq, admit: DecodeAdmit) -> None:
        """On joining the batch: the keys of the prompt's full blocks (generated blocks chain on them)."""
        n_full = admit.prompt_len // self.layout.block_size
        seq.keys = list(admit.block_keys[:n_full])

    def generated(self, seq: RunningSeq, block: int) -> None:
        """Decoding just filled `block`: key it (chained on the previous key) and save it."""
        bs = self.layout.block_size
        if block != len(seq.keys):
            return  # a gap (prompt keys unknown): nothing to chain on
        parent = seq.keys[-1] if seq.keys else self.layout.fingerprint
        seq.keys.append(chain_hash(parent, seq.context(block * bs, (block + 1) * bs)))
        self._save(seq, [block])

    def _save(self, seq: RunningSeq, blocks: list[int]) -> None:
        req = seq.req
        self.pending[req.req_id] += 1
        msg = SaveKV(req.req_id, [req.blocks[b] for b in blocks], [seq.keys[b] for b in blocks], self.node,
                     self.layout)
        self.spawn(self._request(req, msg), name=f"persist-{req.req_id}")

    async def _request(self, req: EngineRequest, msg: SaveKV, count: bool = True) -> None:
        """`count`: the save reads the request's KV blocks, so they are kept until copied out."""
        try:
            res = await self.bus.request(self.subject, msg, timeout=self.timeout_s, ctx=req.ctx,
                                         abort=self.tm.current())
            self.m_saved.inc(res.copied)
            if res.error:
                log.warning("persist of %s: %s", req.req_id, res.error)  # pragma: no mutate
        except BusError as exc:
            log.warning("persist of %s failed: %s", req.req_id, exc.reason)  # pragma: no mutate
        except Exception as exc:  # noqa: BLE001 - a broken save ends its request, not the engine
            log.exception("persist of %s failed", req.req_id)  # pragma: no mutate
            self.m_failed.inc()
            self.on_failure(req, f"persisting its KV failed: {type(exc).__name__}: {exc}")
        finally:
            if count:
                self._copied(req)

    def _copied(self, req: EngineRequest) -> None:
        self.pending[req.req_id] -= 1
        if self.pending[req.req_id] <= 0:
            del self.pending[req.req_id]
            later = self.deferred.pop(req.req_id, None)
            if later is not None:
                self.release(later)

    def busy(self, req_id: str) -> bool:
        return self.pending.get(req_id, 0) > 0

    def release_later(self, req: EngineRequest) -> None:
        self.deferred[req.req_id] = req
