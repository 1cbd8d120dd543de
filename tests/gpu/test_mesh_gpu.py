"""The whole mesh with both engines on CUDA (`device=cuda`), tiny and tiny-mla: a first turn on an
empty store and a second loaded through the store on both paths, against the CPU reference.

Skipped, with the reason, where torch sees no CUDA device. CUDA and CPU round differently:
tokens must be identical, logprobs within 1e-3 (the CPU mesh holds 1e-4).
"""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import torch

from tests.integration.exactness import ask, logprob_diff, wait_stored
from tests.integration.meshutil import tiny_mesh

pytestmark = [pytest.mark.gpu, pytest.mark.integration,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs CUDA: torch.cuda.is_available() is False (no GPU here)")]
GPU_TOL = 1e-3


@pytest.mark.parametrize("spec", ["tiny", "tiny-mla"])
def test_a_cuda_mesh_is_exact_against_the_cpu_reference(tmp_path, spec):
    from shared.model.loader import load_model

    reference = load_model(spec)
    cuda = {"device": "cuda"}
    mesh = tiny_mesh(tmp_path, model=spec, kv_blocks=128,
                     extra={"scheduler": {"liveness-timeout-s": "2"}, "prefill_engine": cuda, "decode_engine": cuda})
    mesh.start(timeout=180)
    try:
        p1 = f"[gpu {uuid.uuid4().hex[:8]}] agent log: " + "read file ok; ran tests, 2 passed; " * 14
        r1 = ask(mesh.url, p1, 40)
        got, want, diff = logprob_diff(r1, reference, r1["choices"][0]["prompt_token_ids"])
        print(f"EXACTNESS cuda {spec} empty store: max |logprob diff| {diff:.2e}")
        assert got == want and diff <= GPU_TOL
        ids = r1["choices"][0]["prompt_token_ids"] + r1["choices"][0]["token_ids"]
        wait_stored(Path(mesh.spec.store), reference, ids, (len(ids) - 1) // 64)
        prompt = ids + reference.tokenizer.encode(" tool: done. " * 4)
        for mode in ("basic", "dualpath-split"):
            body = ask(mesh.url, prompt, 24, dualpath_mode=mode)
            assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= 8 * 64
            got, want, diff = logprob_diff(body, reference, prompt)
            print(f"EXACTNESS cuda {spec} {mode}: max |logprob diff| {diff:.2e}")
            assert got == want and diff <= GPU_TOL
    finally:
        mesh.stop()
