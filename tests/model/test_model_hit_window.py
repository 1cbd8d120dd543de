"""A forward whose stored hits live in a window of a few layers computes exactly what a forward over
whole blocks computes (GQA and MLA): each layer of the hits is copied into the ring just before
that layer runs, as the prefill engine's traffic-manager does, and the slots of layer l are reused
for layer l + window."""
from __future__ import annotations

import random

import pytest
import torch

from shared.kv.window import NO_BLOCK, HitWindow, layer_blocks
from shared.model.batch import ForwardBatch, SeqSlice
from shared.model.kv_cache import PagedKVCache
from shared.model.loader import load_model

pytestmark = pytest.mark.model
torch.set_num_threads(1)
BS = 8


class RingLoader:
    """LayerHooks: before layer l, copy layer l of the stored blocks into their ring slots; after
    it, scribble over the slots (their next user must not see stale bytes)."""

    def __init__(self, kv: PagedKVCache, stored: list[int], window: HitWindow):
        self.pool, self.stored, self.window, self.n = kv.layer_blocks(), stored, window, kv.n_layers
        self.loaded: list[int] = []

    def before_layer(self, layer: int) -> None:
        src = [b * self.n + layer for b in self.stored]
        dst = [self.window.layer_block(j, layer) for j in range(len(self.stored))]
        self.pool[dst] = self.pool[src]
        self.loaded.append(layer)

    def after_layer(self, layer: int) -> None:
        pass


def _ids(n: int, seed: int, hi: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(hi) for _ in range(n)]


@pytest.mark.parametrize("preset,window_layers", [("tiny", 1), ("tiny", 3), ("tiny-mla", 1), ("tiny-mla", 2)])
@pytest.mark.parametrize("miss", [1, 13])
def test_windowed_hits_compute_what_whole_blocks_compute(preset, window_layers, miss):
    m = load_model(preset, seed=0)
    n_layers = m.config.n_layers
    if window_layers >= n_layers:
        pytest.skip(f"{preset} has {n_layers} layers")
    hits = 5
    ids = _ids(hits * BS + miss, 3, min(m.config.vocab_size, 250))
    kv = PagedKVCache.allocate(m.config, 40, block_size=BS)
    stored = [30, 31, 32, 33, 34]  # the prompt's hits, computed once into whole blocks
    m.model.forward(ForwardBatch([SeqSlice(ids[:hits * BS], 0, stored)]), kv)
    own = [20, 21]  # blocks of the miss part
    whole = m.model.forward(ForwardBatch([SeqSlice(ids[hits * BS:], hits * BS, stored + own)]), kv)
    expect_written = kv.data[own].clone()
    kv.data[own] = 0
    ring = tuple(range(10, 10 + HitWindow.ring_blocks(hits, window_layers, n_layers)))
    kv.data[list(ring)] = float("nan")  # nothing but what the loader copies may be read from the ring
    window = HitWindow(hits, ring, window_layers, n_layers)
    loader = RingLoader(kv, stored, window)
    table = [NO_BLOCK] * hits + own
    out = m.model.forward(ForwardBatch([SeqSlice(ids[hits * BS:], hits * BS, table, window)]), kv, loader)
    # one miss token: whole blocks attend it as a decode row, the window as a one-token prefill
    torch.testing.assert_close(out, whole, atol=2e-4, rtol=0)
    torch.testing.assert_close(kv.data[own], expect_written, atol=1e-5, rtol=0)
    assert loader.loaded == list(range(n_layers))


def test_the_ring_reuses_a_layers_slots_for_the_layer_one_window_later():
    w = HitWindow(hits=6, ring=(7,), layers=5, n_layers=30)
    assert w.layer_block(2, 7) == 7 * 30 + 14 and w.layer_block(2, 2) == w.layer_block(2, 7)
    assert w.released_before(7) == 2 and w.released_before(4) == -1
    slots = {w.layer_block(j, layer) for j in range(6) for layer in range(5)}
    assert len(slots) == 30  # one block of Layer Blocks, each used once per window
    assert HitWindow.ring_blocks(6, 5, 30) == 1 and HitWindow.ring_blocks(61, 4, 30) == 9
    assert layer_blocks([NO_BLOCK, 4], 3, 30, HitWindow(1, (9,), 2, 30)) == [9 * 30 + 1, 4 * 30 + 3]
    with pytest.raises(ValueError):
        layer_blocks([NO_BLOCK, 4], 3, 30)
    with pytest.raises(ValueError):
        HitWindow(hits=61, ring=(1,), layers=4, n_layers=30)
