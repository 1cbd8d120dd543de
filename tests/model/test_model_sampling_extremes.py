"""Sampling never produces NaN probabilities at the edges the API accepts: a temperature
or top_p so small it underflows float32 behaves like greedy (found by the API fuzz test)."""
from __future__ import annotations

import pytest
import torch

from shared.model.sampling import sample, top_p_filter

pytestmark = pytest.mark.model


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-45, 1e-30])
def test_a_tiny_temperature_is_greedy(temperature):
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1)) * 30
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    assert sample(logits, [temperature] * 3, [1.0] * 3, gens) == logits.argmax(-1).tolist()


@pytest.mark.parametrize("top_p", [5e-324, 1e-300, 1e-45])
def test_a_tiny_top_p_keeps_the_top_token(top_p):
    probs = torch.softmax(torch.randn(50, generator=torch.Generator().manual_seed(2)), -1)
    kept = top_p_filter(probs, top_p)
    assert not kept.isnan().any() and kept.argmax() == probs.argmax() and kept.max() == 1.0


def test_a_huge_temperature_is_uniform_not_nan():
    logits = torch.randn(1, 50)
    assert 0 <= sample(logits, [1e300], [1.0], [torch.Generator().manual_seed(0)])[0] < 50
