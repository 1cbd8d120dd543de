"""The model, its paged kernels and the engine's KV copy path on CUDA, against the CPU reference.

Skipped, with the reason, where torch sees no CUDA device (CI, the 2-core dev machine).
fp32 throughout; CUDA and CPU round differently, so the bound is 1e-4 relative on logits
(the CPU tier holds 1e-5 against its own reference).
"""
from __future__ import annotations

import threading

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs CUDA: torch.cuda.is_available() is False (no GPU here)")]
REL = 1e-4


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.cpu().double() - b.cpu().double()).norm() / b.cpu().double().norm())


@pytest.fixture(scope="module", params=["tiny", "tiny-mla"])
def pair(request):
    from shared.model.loader import load_model

    return load_model(request.param), load_model(request.param, device="cuda")


def test_paged_prefill_chunks_and_decode_on_cuda_match_the_cpu_reference(pair):
    from shared.model.batch import ForwardBatch, SeqSlice
    from shared.model.kv_cache import PagedKVCache

    cpu, gpu = pair
    assert gpu.model.embed_tokens.weight.is_cuda
    ids = cpu.tokenizer.encode("a context long enough for a few blocks of the paged cache, on the GPU " * 3)
    kv = PagedKVCache.allocate(gpu.config, 8, 16, device="cuda")
    table = [5, 1, 7, 0, 3, 6, 2, 4][: -(-len(ids) // 16)]
    got = {}
    with torch.inference_mode():
        got[39] = gpu.model.forward(ForwardBatch([SeqSlice(ids[:40], 0, table)]), kv)[0]  # prefill
        got[len(ids) - 4] = gpu.model.forward(ForwardBatch([SeqSlice(ids[40:-3], 40, table)]), kv)[0]  # chunk
        for p in range(len(ids) - 3, len(ids)):  # decode
            got[p] = gpu.model.forward(ForwardBatch([SeqSlice([ids[p]], p, table)]), kv)[0]
        ref = cpu.model.forward_reference(ids)
        cuda_ref = gpu.model.forward_reference(ids)
    for pos, logits in got.items():
        assert logits.is_cuda
        assert rel(logits, ref[pos]) <= REL, pos
    assert rel(cuda_ref, ref) <= REL


def test_paged_decode_kernels_on_cuda_match_their_cpu_references():
    from kernels import paged_decode, paged_mla

    g = torch.Generator().manual_seed(0)
    lens = [1, 17, 64, 93, 300]
    tables = torch.randperm(60, generator=g)[: 5 * 20].view(5, 20)
    layer = torch.randn(60, 2, 16, 2, 32, generator=g)
    q = torch.randn(5, 8, 32, generator=g)
    want = paged_decode.reference(q, layer, tables, lens)
    got = paged_decode.paged_decode(q.cuda(), layer.cuda(), tables.cuda(), lens)
    assert got.is_cuda and (got.cpu() - want).abs().max() < 1e-4
    latent = torch.randn(60, 2, 16, 1, 20, generator=g)
    ql = torch.randn(5, 4, 32, generator=g)
    want = paged_mla.reference(ql, latent, tables, lens, values=24, scale=0.2)
    got = paged_mla.paged_mla_decode(ql.cuda(), latent.cuda(), tables.cuda(), lens, values=24, scale=0.2)
    assert got.is_cuda and (got.cpu() - want).abs().max() < 1e-4


def test_the_kv_copy_path_on_cuda_pins_the_host_region_and_gates_each_layer(pair):
    """Stored KV lands in the pinned host region layer by layer (another thread, as the TM does)
    while the CUDA forward runs; the compute stream waits on each layer's copy event; the new
    KV comes back down. The logits equal the CPU reference and the host holds the device's KV."""
    from services.prefill_engine.layers import LayerGate, LoadProgress
    from shared.engine.kv_memory import KVMemory
    from shared.model.batch import ForwardBatch, SeqSlice
    from shared.model.kv_cache import PagedKVCache

    cpu, gpu = pair
    bs, hits = 16, 3
    ids = cpu.tokenizer.encode("stored KV goes up a layer at a time while the rest computes " * 2)
    stored = PagedKVCache.allocate(cpu.config, hits, bs)
    cpu.model.forward(ForwardBatch([SeqSlice(ids[:hits * bs], 0, list(range(hits)))]), stored)
    kv = KVMemory(gpu.config, 12, bs, tag="gpu-test-kv", device="cuda")
    try:
        assert kv.copies.separate and kv.copies.stream is not None and kv.copies._pinned
        table = [8, 2, 5, 0, 11, 6, 1, 9, 3][: -(-len(ids) // bs)]
        load = LoadProgress("r")
        load.blocks = table[:hits]

        def land():
            for layer in range(cpu.config.n_layers):
                for i, b in enumerate(table[:hits]):
                    kv.host.data[b, layer] = stored.data[i, layer]
                load.mark(layer)

        gate = LayerGate([load], 30.0, kv.copies, sorted(set(table[hits:])))
        t = threading.Thread(target=land)
        t.start()
        with torch.inference_mode():
            logits = gpu.model.forward(ForwardBatch([SeqSlice(ids[hits * bs:], hits * bs, table)]), kv.cache, gate)
            gate.finish()
        t.join()
        assert len(load.events) == cpu.config.n_layers and all(e is not None for e in load.events)
        assert rel(logits[0], cpu.model.forward_reference(ids)[-1]) <= REL
        for b in table[hits:]:
            assert torch.equal(kv.host.data[b], kv.cache.data[b].cpu())
    finally:
        kv.close()
