"""Paged forward == cache-free reference, for every way the engines call it."""

from __future__ import annotations

import random

import pytest
import torch

from shared.model.batch import ForwardBatch, SeqSlice
from shared.model.kv_cache import PagedKVCache
from shared.model.llama import LayerHooks
from shared.model.loader import load_model

pytestmark = pytest.mark.model
torch.set_num_threads(1)
ATOL = 2e-4  # fp32; logits have std ~5


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=1)


def _ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(259) for _ in range(n)]


def _table(n_blocks: int, seed: int, pool: int = 64) -> list[int]:
    return random.Random(seed).sample(range(pool), n_blocks)


def test_prefill_then_decode_matches_reference(tiny):
    ids = _ids(40, 0)
    ref = tiny.model.forward_reference(ids)  # (T, vocab)
    kv = PagedKVCache.allocate(tiny.config, 64, block_size=8)
    table = _table(5, 0)
    out = tiny.model.forward(ForwardBatch([SeqSlice(ids[:25], 0, table)]), kv)
    torch.testing.assert_close(out[0], ref[24], atol=ATOL, rtol=0)
    for p in range(25, 40):
        out = tiny.model.forward(ForwardBatch([SeqSlice([ids[p]], p, table)]), kv)
        torch.testing.assert_close(out[0], ref[p], atol=ATOL, rtol=0)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_chunked_prefill_at_arbitrary_split_points_matches_reference(tiny, block_size):
    ids = _ids(50, 1)
    ref = tiny.model.forward_reference(ids)
    for trial in range(3):
        cuts = sorted(random.Random(trial).sample(range(1, 50), 4)) + [50]
        kv = PagedKVCache.allocate(tiny.config, 64, block_size=block_size)
        table = _table(-(-50 // block_size), trial)
        start = 0
        for cut in cuts:
            out = tiny.model.forward(ForwardBatch([SeqSlice(ids[start:cut], start, table)]), kv)
            torch.testing.assert_close(out[0], ref[cut - 1], atol=ATOL, rtol=0)
            start = cut


def test_mixed_batch_of_prefills_and_decodes_with_scattered_blocks(tiny):
    lens = [37, 5, 64, 1, 20]
    seqs = [_ids(n + 12, 10 + i) for i, n in enumerate(lens)]
    refs = [tiny.model.forward_reference(s) for s in seqs]
    kv = PagedKVCache.allocate(tiny.config, 64, block_size=8)
    pool = random.Random(7).sample(range(64), 64)  # non-contiguous, interleaved tables
    tables = [pool[i::5] for i in range(5)]
    # step 1: uneven prefixes (two sequences only partly), all in one batch
    firsts = [n - 3 if n > 3 else n for n in lens]
    out = tiny.model.forward(ForwardBatch([SeqSlice(s[:f], 0, t) for s, f, t in zip(seqs, firsts, tables)]), kv)
    for i, f in enumerate(firsts):
        torch.testing.assert_close(out[i], refs[i][f - 1], atol=ATOL, rtol=0)
    # steps 2..: every sequence advances by 1 or by a chunk, together
    pos = list(firsts)
    for step in range(6):
        slices = []
        for i, s in enumerate(seqs):
            n = 1 if (i + step) % 2 else min(3, len(s) - pos[i])
            slices.append(SeqSlice(s[pos[i] : pos[i] + n], pos[i], tables[i]))
        out = tiny.model.forward(ForwardBatch(slices), kv)
        for i, sl in enumerate(slices):
            torch.testing.assert_close(out[i], refs[i][sl.end_pos - 1], atol=ATOL, rtol=0)
            pos[i] = sl.end_pos


def test_forward_accepts_a_plain_list_of_slices(tiny):
    ids = _ids(9, 3)
    kv = PagedKVCache.allocate(tiny.config, 4, block_size=4)
    out = tiny.model.forward([SeqSlice(ids, 0, [2, 0, 1])], kv)
    torch.testing.assert_close(out[0], tiny.model.forward_reference(ids)[-1], atol=ATOL, rtol=0)


class Recorder(LayerHooks):
    def __init__(self, kv: PagedKVCache, block: int) -> None:
        self.calls: list[tuple[str, int]] = []
        self.kv, self.block = kv, block

    def before_layer(self, layer: int) -> None:
        self.calls.append(("before", layer))
        assert not self.kv.data[self.block, layer].any(), "layer written before before_layer"

    def after_layer(self, layer: int) -> None:
        self.calls.append(("after", layer))
        assert self.kv.data[self.block, layer].any(), "after_layer ran before the KV write"


def test_hooks_run_once_per_layer_in_order_around_the_kv_write(tiny):
    kv = PagedKVCache.allocate(tiny.config, 4, block_size=8)
    hooks = Recorder(kv, block=3)
    tiny.model.forward(ForwardBatch([SeqSlice(_ids(5, 4), 0, [3])]), kv, hooks)
    want = [(w, layer) for layer in range(tiny.config.n_layers) for w in ("before", "after")]
    assert hooks.calls == want


class LayerLoader(LayerHooks):
    """Copies each layer's stored KV into the cache only when that layer asks for it."""

    def __init__(self, src: PagedKVCache, dst: PagedKVCache, blocks: list[int]) -> None:
        self.src, self.dst, self.blocks = src, dst, blocks
        self.loaded: list[int] = []

    def before_layer(self, layer: int) -> None:
        for b in self.blocks:
            self.dst.data[b, layer] = self.src.data[b, layer]
        self.loaded.append(layer)


def test_layerwise_loaded_prefix_gives_the_reference_answer(tiny):
    ids = _ids(30, 5)
    ref = tiny.model.forward_reference(ids)
    table = [6, 2, 9, 4]
    stored = PagedKVCache.allocate(tiny.config, 10, block_size=8)
    tiny.model.forward(ForwardBatch([SeqSlice(ids[:16], 0, table)]), stored)  # "storage": 2 full blocks
    engine = PagedKVCache.allocate(tiny.config, 10, block_size=8)
    hooks = LayerLoader(stored, engine, table[:2])
    out = tiny.model.forward(ForwardBatch([SeqSlice(ids[16:], 16, table)]), engine, hooks)
    torch.testing.assert_close(out[0], ref[-1], atol=ATOL, rtol=0)
    assert hooks.loaded == list(range(tiny.config.n_layers))
    cold = PagedKVCache.allocate(tiny.config, 10, block_size=8)  # nothing loaded: wrong answer
    wrong = tiny.model.forward(ForwardBatch([SeqSlice(ids[16:], 16, table)]), cold)
    assert (wrong[0] - ref[-1]).abs().max() > 1e-2


def test_short_block_table_is_refused(tiny):
    kv = PagedKVCache.allocate(tiny.config, 4, block_size=4)
    with pytest.raises(ValueError, match="block_table"):
        tiny.model.forward(ForwardBatch([SeqSlice(_ids(9, 6), 0, [0, 1])]), kv)


def test_cache_of_another_shape_is_refused(tiny):
    other = load_model('random:{"n_layers": 2}')
    kv = PagedKVCache.allocate(other.config, 4, block_size=4)
    with pytest.raises(ValueError, match="does not fit"):
        tiny.model.forward(ForwardBatch([SeqSlice([1, 2], 0, [0])]), kv)
