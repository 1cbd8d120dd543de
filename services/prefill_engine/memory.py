"""KV memory of one prompt on the prefill engine: whole blocks, or its stored hits in a window.

Owns the allocation only; the blocks are freed with the request."""
from __future__ import annotations

import dataclasses

from services.prefill_engine.record import PrefillRequest
from shared.engine.kv_memory import KVMemory
from shared.kv.window import NO_BLOCK, HitWindow


def blocks_needed(kv: KVMemory, prompt_len: int, hits: int, window_layers: int, n_layers: int) -> tuple[int, int]:
    """(ring blocks, own blocks) a prompt takes: (0, all) without a window."""
    if hits <= 0 or not 0 < window_layers < n_layers:
        return 0, kv.blocks_for(prompt_len)
    return HitWindow.ring_blocks(hits, window_layers, n_layers), kv.blocks_for(prompt_len - hits * kv.block_size)


def allocate(kv: KVMemory, req: PrefillRequest, hits: int, window_layers: int, n_layers: int) -> bool:
    """Give `req` its KV blocks (`req.blocks`, and `req.window` when windowed); False: no room now."""
    ring_n, own_n = blocks_needed(kv, len(req.prompt), hits, window_layers, n_layers)
    if not kv.alloc.can_allocate(ring_n + own_n):
        return False
    got = kv.alloc.allocate(req.req_id, ring_n + own_n)
    if ring_n:
        req.window = HitWindow(hits, tuple(got[:ring_n]), window_layers, n_layers)
        req.blocks = [NO_BLOCK] * hits + got[ring_n:]
    else:
        req.blocks = got
    return True


def fill_short_read(kv: KVMemory, req: PrefillRequest, found: int) -> bool:
    """A short read: blocks of their own for the hits not found; False when KV memory has no room."""
    w = req.window
    if w is None or found >= w.hits:
        return True
    gap = w.hits - found
    if not kv.alloc.can_allocate(gap):
        return False
    req.blocks[found:w.hits] = kv.alloc.allocate(req.req_id, gap)
    req.window = dataclasses.replace(w, used=found) if found else None
    return True
