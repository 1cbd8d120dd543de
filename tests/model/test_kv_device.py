"""The device path of an engine's KV memory, run on CPU with `kv_mirror` (the same code a GPU runs):
the model computes into a cache apart from the host region the traffic-manager fills, stored KV
goes up layer by layer through the LayerGate while the forward runs, and the new KV comes back
down to the host region for the TM to push. Outputs equal the one-cache path's; without the
copies they do not (the mirror really is apart)."""
from __future__ import annotations

import threading

import pytest
import torch

from services.prefill_engine.layers import LayerGate, LoadProgress
from shared.engine.kv_device import DeviceCopies, _slabs
from shared.engine.kv_memory import KVMemory
from shared.model.batch import ForwardBatch, SeqSlice
from shared.model.kv_cache import PagedKVCache
from shared.model.loader import load_model

pytestmark = pytest.mark.model
torch.set_num_threads(1)
BS = 16


@pytest.fixture(scope="module", params=["tiny", "tiny-mla"])
def loaded(request):
    return load_model(request.param, seed=0)


@pytest.fixture
def mirror(loaded):
    kv = KVMemory(loaded.config, 12, BS, tag="test-kv", mirror=True)
    yield kv
    kv.close()


def test_a_mirror_cache_is_apart_and_copies_move_only_what_they_name(loaded, mirror):
    host, dev = mirror.host.data, mirror.cache.data
    assert mirror.copies.separate and dev.data_ptr() != host.data_ptr() and dev.shape == host.shape
    host[3].fill_(1.0)
    host[4].fill_(2.0)
    mirror.copies.upload([3, 4], layer=1)
    assert torch.equal(dev[3, 1], host[3, 1]) and torch.equal(dev[4, 1], host[4, 1])
    assert torch.count_nonzero(dev[3, 0]) == 0 and torch.count_nonzero(dev[5]) == 0  # other layers, blocks
    dev[7].fill_(5.0)
    mirror.copies.download([7])
    assert torch.equal(host[7], dev[7])
    assert torch.count_nonzero(host[6]) == 0


def test_one_cache_means_no_copies(loaded):
    kv = KVMemory(loaded.config, 4, BS, tag="test-kv")
    try:
        assert not kv.copies.separate and kv.cache is kv.host
        assert kv.copies.upload([0, 1]) is None and kv.copies.download([2], 0) is None
    finally:
        kv.close()


def test_whole_blocks_move_as_runs_and_layers_block_by_block():
    assert _slabs([5, 2, 3, 9, 4], None) == [(slice(2, 6),), (slice(9, 10),)]
    assert _slabs([5, 2], 1) == [(5, 1), (2, 1)]


def _stored(loaded, prompt: list[int], hits: int) -> torch.Tensor:
    """The KV of the prompt's first `hits` blocks, as a store would hand them back (one-cache reference)."""
    kv = PagedKVCache.allocate(loaded.config, hits, BS)
    loaded.model.forward(ForwardBatch([SeqSlice(prompt[:hits * BS], 0, list(range(hits)))]), kv)
    return kv.data


def _layered_prefill(loaded, kv: KVMemory, prompt: list[int], hits: int, copies) -> torch.Tensor:
    """Hits land in the host region layer by layer from another thread (as the TM's copies do)
    while the forward computes the rest through the LayerGate; the logits of the last token."""
    table = [8, 2, 5, 0, 11, 6, 1, 9, 3][: -(-len(prompt) // BS)]
    stored = _stored(loaded, prompt, hits)
    load = LoadProgress("r")
    load.blocks = table[:hits]

    def land():
        for layer in range(loaded.config.n_layers):
            for i, b in enumerate(table[:hits]):
                kv.host.data[b, layer] = stored[i, layer]
            load.mark(layer)

    written = sorted(set(table[hits:]))
    gate = LayerGate([load], 30.0, copies, written)
    t = threading.Thread(target=land)
    t.start()
    logits = loaded.model.forward(ForwardBatch([SeqSlice(prompt[hits * BS:], hits * BS, table)]), kv.cache, gate)
    gate.finish()
    t.join()
    return logits[0], table


def test_layerwise_upload_and_download_equal_the_one_cache_path(loaded, mirror):
    prompt = loaded.tokenizer.encode("stored KV goes up a layer at a time while the rest computes " * 2)
    assert len(prompt) > 5 * BS
    ref = loaded.model.forward_reference(prompt)[-1]
    got, table = _layered_prefill(loaded, mirror, prompt, 3, mirror.copies)
    assert float((got - ref).norm() / ref.norm()) <= 1e-5
    for b in table[3:]:  # the new KV is in the host region now, where the TM pushes it from
        assert torch.equal(mirror.host.data[b], mirror.cache.data[b])


def test_without_the_copies_the_mirror_computes_something_else(loaded, mirror):
    """The check has teeth: a gate that never sends stored KV up leaves the device cache's hit
    blocks empty, and the logits move."""
    prompt = loaded.tokenizer.encode("stored KV goes up a layer at a time while the rest computes " * 2)
    ref = loaded.model.forward_reference(prompt)[-1]
    got, _ = _layered_prefill(loaded, mirror, prompt, 3, None)
    assert float((got - ref).norm() / ref.norm()) > 1e-2


def test_a_cuda_device_that_is_not_there_is_a_bad_setting():
    from shared.config import ConfigError
    from shared.engine.service import check_device

    check_device("cpu")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ConfigError) as err:
        check_device("cuda")
    assert err.value.key == "device" and "no CUDA device" in str(err.value)


def test_device_copies_of_a_cpu_pair_need_no_stream():
    host, dev = PagedKVCache(torch.zeros(2, 1, 2, 4, 1, 2), 4), PagedKVCache(torch.ones(2, 1, 2, 4, 1, 2), 4)
    c = DeviceCopies(host, dev)
    assert c.stream is None and c.separate
    c.download([1])
    assert torch.count_nonzero(host.data[0]) == 0 and torch.equal(host.data[1], dev.data[1])
