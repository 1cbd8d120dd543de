"""The decode engine's attention over long contexts runs split-KV + LSE merge and equals single-pass."""
from __future__ import annotations

import pytest
import torch

import kernels.decode
from shared.model import attention
from shared.model.batch import ForwardBatch, SeqSlice
from shared.model.kv_cache import PagedKVCache
from shared.model.loader import load_model

pytestmark = pytest.mark.model


def test_long_context_decode_uses_split_kv_and_matches_the_reference(monkeypatch):
    torch.set_num_threads(1)
    lm = load_model("tiny", seed=3)
    # lower the thresholds so a short test context takes the long-context path (3 splits)
    monkeypatch.setattr(attention, "SPLIT_KV_THRESHOLD", 100)
    monkeypatch.setattr(attention, "SPLIT_KV_SIZE", 64)
    calls = []
    real = kernels.decode.split_kv
    monkeypatch.setattr(kernels.decode, "split_kv", lambda *a, **k: calls.append(1) or real(*a, **k))
    short = list(range(40, 90))  # stays on the padded single-pass path, batched with the long one
    long = list(range(30, 200))
    kv = PagedKVCache.allocate(lm.config, 8, 64)
    tables = [[0, 1, 2, 3], [4, 5]]
    with torch.inference_mode():
        lm.model.forward(ForwardBatch([SeqSlice(long[:-1], 0, tables[0]), SeqSlice(short[:-1], 0, tables[1])]), kv)
        got = lm.model.forward(ForwardBatch([SeqSlice(long[-1:], len(long) - 1, tables[0]),
                                             SeqSlice(short[-1:], len(short) - 1, tables[1])]), kv)
        want_long = lm.model.forward_reference(long)[-1]
        want_short = lm.model.forward_reference(short)[-1]
    assert calls, "the long sequence did not take the split-KV path"
    torch.testing.assert_close(got[0], want_long, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[1], want_short, atol=1e-4, rtol=1e-4)
