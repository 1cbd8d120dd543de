"""Log-probabilities: `sampling.token_logprobs` (the one definition both engines and the
reference use) and the reference's `generate_detailed` against the cache-free forward."""

from __future__ import annotations

import pytest
import torch

from shared.model.loader import load_model
from shared.model.reference import generate, generate_detailed
from shared.model.sampling import make_generator, sample, token_logprobs

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


def test_chosen_logprob_and_top_n_are_log_softmax_of_the_raw_logits():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0)) * 4
    want = torch.log_softmax(logits.double(), -1)
    got = token_logprobs(logits, [5, 7, 9], [3, 0, 40])
    for row, (lp, chosen, n) in enumerate(zip(got, [5, 7, 9], [3, 0, 40])):
        assert lp.logprob == pytest.approx(want[row, chosen].item(), abs=1e-5)
        order = want[row].argsort(descending=True)[:n].tolist()
        assert lp.top_ids == order  # most likely first
        assert lp.top_logprobs == pytest.approx(want[row, order].tolist(), abs=1e-5)
    assert got[1].top_ids == [] and got[1].top_logprobs == []


def test_a_chosen_token_outside_the_top_n_is_still_reported():
    logits = torch.tensor([[5.0, 4.0, 3.0, -2.0]])
    (lp,) = token_logprobs(logits, [3], [2])
    assert lp.top_ids == [0, 1]
    assert lp.logprob == pytest.approx(torch.log_softmax(logits, -1)[0, 3].item())


def test_rows_that_did_not_ask_get_none():
    logits = torch.randn(3, 10)
    got = token_logprobs(logits, [0, 1, 2], [None, 1, None])
    assert got[0] is None and got[2] is None and len(got[1].top_ids) == 1
    assert token_logprobs(logits, [0, 1, 2], [None] * 3) == [None] * 3


def test_values_ignore_temperature_and_top_p():
    logits = torch.randn(1, 30, generator=torch.Generator().manual_seed(1)) * 3
    g = make_generator(5)
    for _ in range(20):
        (tok,) = sample(logits, [0.3], [0.5], [g])
        (lp,) = token_logprobs(logits, [tok], [1])
        assert lp.logprob == pytest.approx(torch.log_softmax(logits, -1)[0, tok].item(), abs=1e-6)


def test_reference_logprobs_equal_log_softmax_of_the_cache_free_forward(tiny):
    prompt = tiny.tokenizer.encode("Logprobs of the reference, checked against forward_reference.")
    gen = generate_detailed(tiny, prompt, 20, top_logprobs=5, ignore_eos=True, block_size=16)
    assert gen.ids == generate(tiny, prompt, 20, ignore_eos=True, block_size=16)
    assert len(gen.logprobs) == len(gen.ids) == 20
    logits = tiny.model.forward_reference(prompt + gen.ids)  # (T, vocab)
    want = torch.log_softmax(logits.float(), -1)[len(prompt) - 1:-1]  # row i predicts gen.ids[i]
    for i, (tok, lp) in enumerate(zip(gen.ids, gen.logprobs)):
        assert abs(lp.logprob - want[i, tok].item()) <= 1e-5
        assert lp.top_ids[0] == tok  # greedy: the chosen token is the most likely
        assert torch.allclose(torch.tensor(lp.top_logprobs), want[i].topk(5).values, atol=1e-5)


def test_sampled_reference_reports_the_pre_temperature_logprob(tiny):
    prompt = tiny.tokenizer.encode("hot sampling")
    gen = generate_detailed(tiny, prompt, 12, top_logprobs=0, temperature=1.7, top_p=0.9, seed=3, ignore_eos=True)
    logits = tiny.model.forward_reference(prompt + gen.ids)
    raw = torch.log_softmax(logits.float(), -1)[len(prompt) - 1:-1]
    hot = torch.log_softmax(logits.float() / 1.7, -1)[len(prompt) - 1:-1]
    got = torch.tensor([lp.logprob for lp in gen.logprobs])
    want = raw[torch.arange(12), torch.tensor(gen.ids)]
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, hot[torch.arange(12), torch.tensor(gen.ids)], atol=1e-3)
