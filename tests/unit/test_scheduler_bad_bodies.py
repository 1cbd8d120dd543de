"""Bodies the API fuzz test found answered with a 5xx (or killing the scheduler): now 400s."""
from __future__ import annotations

import pytest

from services.scheduler.protocol import ApiError, CompletionRequest, check_sampling, decode_body

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("depth", [5_000, 100_000])
def test_deeply_nested_json_is_a_400(depth):
    raw = b'{"prompt": "hi", "x": ' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(ApiError) as err:
        decode_body(raw, CompletionRequest)
    assert err.value.status == 400


@pytest.mark.parametrize("seed", [2 ** 64, -(2 ** 63) - 1, 10 ** 30])
def test_a_seed_the_bus_cannot_carry_is_a_400(seed):
    req = CompletionRequest(prompt="hi", seed=seed)
    with pytest.raises(ApiError) as err:
        check_sampling(req, 4, 2, 64)
    assert (err.value.status, err.value.param) == (400, "seed")


@pytest.mark.parametrize("seed", [0, -(2 ** 63), 2 ** 64 - 1])
def test_64_bit_seeds_are_accepted(seed):
    assert check_sampling(CompletionRequest(prompt="hi", seed=seed), 4, 2, 64) == 4
