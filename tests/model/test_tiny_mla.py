"""`tiny-mla` is evidence like `tiny`: a toy DeepSeek-V3 whose next-token distribution reacts
to every block of its latent KV, whose greedy text is varied and printable, and which the
single-process reference generation runs end to end (greedy, logprobs)."""
from __future__ import annotations

import pytest
import torch

from dualpath.bench import sensitivity as sens
from shared.model.loader import load_model
from shared.model.reference import generate, generate_detailed
from shared.model.tokenizer_build import load_tokenizer
from tests.model.test_tiny_sensitivity import MESH_PROMPTS, _runs

pytestmark = pytest.mark.model
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def mla():
    return load_model("tiny-mla", seed=0)


def test_every_single_block_perturbation_of_the_latent_moves_the_logprobs(mla):
    perts = sens.perturbations(8, mla.config.n_layers)
    all_p, all_d = [], []
    for text in sens.PROMPTS:
        _, diffs = sens.measure(mla, sens.prompt_ids(mla, text, 8, 16), 16, 16, perts)
        all_p += perts
        all_d += diffs
    table = sens.table(all_p, all_d)
    for what, tried, detected, _ in table.rows:
        assert detected >= 0.95 * tried, table.render()


@pytest.mark.parametrize("text", MESH_PROMPTS)
def test_greedy_text_is_varied_and_printable(mla, text):
    out = generate(mla, mla.tokenizer.encode(text), 48, ignore_eos=True)
    assert len(set(out)) >= 12, mla.tokenizer.decode(out)
    assert max(len(run) for run in _runs(out)) <= 3, mla.tokenizer.decode(out)
    assert all(t == 10 or 32 <= t < 127 for t in out), out


def test_reference_generation_logprobs_equal_the_cache_free_pass(mla):
    """Greedy prefill + decode through the paged cache (absorbed MLA) scores each chosen token as
    the no-cache pass (K/V materialised) scores the same sequence."""
    ids = mla.tokenizer.encode("Once upon a time")
    gen = generate_detailed(mla, ids, 24, top_logprobs=3, ignore_eos=True, block_size=16)
    assert len(gen.ids) == 24 and len(gen.logprobs) == 24
    full = mla.model.forward_reference(ids + gen.ids[:-1]).log_softmax(-1)
    for j, (token, lp) in enumerate(zip(gen.ids, gen.logprobs)):
        row = full[len(ids) - 1 + j]
        assert token == int(row.argmax())
        assert abs(lp.logprob - float(row[token])) <= 1e-4, j


def test_the_seed_is_the_weights_and_the_tokenizer_is_the_byte_one(mla):
    again, other = load_model("tiny-mla", seed=0), load_model("tiny-mla", seed=1)
    ids = mla.tokenizer.encode("same seed")
    assert torch.equal(again.model.forward_reference(ids), mla.model.forward_reference(ids))
    assert not torch.equal(other.model.forward_reference(ids), mla.model.forward_reference(ids))
    assert mla.model_id == "tiny-mla1@seed0" and other.model_id == "tiny-mla1@seed1"
    assert load_tokenizer("tiny-mla").encode("hi") == mla.tokenizer.encode("hi")
