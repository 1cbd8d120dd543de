"""The `tiny` model is evidence: its next-token distribution reacts to every block of its KV.

A mesh exactness test compares the mesh's logprobs with the single-process reference; that
only proves the KV was right if a wrong block would have moved them. Here every single-block
perturbation of a prompt's KV (any block, any layer, K or V; zeroed, swapped, or noised by 1%)
is tried, and >= 95% must move the next 16 tokens' logprobs past the mesh tests' tolerance.
"""
from __future__ import annotations

import pytest
import torch

from dualpath.bench import sensitivity as sens
from shared.model.loader import load_model
from shared.model.reference import generate

pytestmark = pytest.mark.model
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


def test_every_single_block_perturbation_moves_the_logprobs(tiny):
    perts = sens.perturbations(8, tiny.config.n_layers)
    assert len(perts) == 8 * tiny.config.n_layers * 2 * len(sens.KINDS)
    all_p, all_d = [], []
    for text in sens.PROMPTS:
        ids = sens.prompt_ids(tiny, text, 8, 16)
        _, diffs = sens.measure(tiny, ids, 16, 16, perts)
        all_p += perts
        all_d += diffs
    rows = {r[0]: r for r in sens.table(all_p, all_d).rows}
    for what, tried, detected, _ in rows.values():
        assert detected >= 0.95 * tried, sens.table(all_p, all_d).render()
    assert rows["all"][1] == 3 * len(perts)


def test_an_unperturbed_copy_measures_exactly_zero(tiny):
    """The measurement itself adds no noise: a copy of the right KV is indistinguishable."""
    ids = sens.prompt_ids(tiny, sens.PROMPTS[0], 8, 16)
    want = generate(tiny, ids, 8, ignore_eos=True, block_size=16)
    per_seq = -(-(len(ids) + 8) // 16)
    from shared.model.batch import ForwardBatch, SeqSlice
    from shared.model.kv_cache import PagedKVCache

    kv = PagedKVCache.allocate(tiny.config, per_seq, 16)
    tiny.model.forward(ForwardBatch([SeqSlice(ids[:-1], 0, list(range(per_seq)))]), kv)
    a, b = sens._decode(tiny, [None, None], kv.data[:8].clone(), ids, want, per_seq, 16)
    assert torch.equal(a, b)


def test_a_noise_perturbation_below_the_tolerance_is_not_counted(tiny):
    """Detection is a threshold on the logprob change, not 'anything happened'."""
    perts = [sens.Perturbation(0, 0, 1, "noise")]
    ids = sens.prompt_ids(tiny, sens.PROMPTS[1], 8, 16)
    _, (diff,) = sens.measure(tiny, ids, 16, 16, perts)
    assert diff > 0
    assert sens.table(perts, [diff], tol=diff * 2).rows[0][2] == 0


MESH_PROMPTS = [  # what the mesh tests send (two turns, chunked prefill, resume, chat)
    "[dualpath 1a2b3c4d] agent log: " + "step ok; " * 50,
    "chunk me please; " * 45,
    "resume me " * 12,
    "hung prefill " * 20,
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time",
]


@pytest.mark.parametrize("text", MESH_PROMPTS)
def test_greedy_text_is_varied_and_printable(tiny, text):
    out = generate(tiny, tiny.tokenizer.encode(text), 48, ignore_eos=True)
    assert len(set(out)) >= 16, tiny.tokenizer.decode(out)
    longest = max(len(run) for run in _runs(out))
    assert longest <= 3, tiny.tokenizer.decode(out)
    assert all(t == 10 or 32 <= t < 127 for t in out), out


def test_sampled_text_never_ends_by_itself(tiny):
    """End-of-sequence is never emitted: max_tokens, stop ids or stop strings end a generation."""
    out = generate(tiny, tiny.tokenizer.encode("Once"), 300, temperature=1.0, seed=3)
    assert len(out) == 300 and not set(out) & set(tiny.config.eos_ids)


def _runs(seq: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for t in seq:
        if runs and runs[-1][0] == t:
            runs[-1].append(t)
        else:
            runs.append([t])
    return runs
