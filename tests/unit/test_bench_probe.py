"""The rate probe times a batch's decode step only while every stream of the batch decodes.

Streams whose prefills finish apart decode alone, then two at a time, before the batch is
whole; a mean over each stream's whole life would take those faster steps for the batch's.
"""
from __future__ import annotations

import pytest

from dualpath.bench.replay import together_step

pytestmark = pytest.mark.unit


def _stream(start: float, tokens: int, step: float) -> list[float]:
    return [start + i * step for i in range(tokens)]


def test_only_the_window_all_streams_share_is_timed():
    # A decodes alone at 1 ms a step for 50 ms, then beside B at 3 ms a step
    a = _stream(0.0, 50, 0.001) + _stream(0.050, 40, 0.003)
    b = _stream(0.050, 40, 0.003)
    step, ctx = together_step([a, b], prompt=100)
    assert step == pytest.approx(0.003)
    whole_life = ((a[-1] - a[0]) / (len(a) - 1) + (b[-1] - b[0]) / (len(b) - 1)) / 2
    assert whole_life < 0.0026  # what the mean of whole lives would say
    assert ctx == pytest.approx(100 + ((50 + 89) / 2 + (0 + 39) / 2) / 2)  # token positions inside the window


def test_no_shared_window_is_none():
    a = _stream(0.0, 10, 0.001)
    b = _stream(0.5, 10, 0.001)  # starts after A ended
    assert together_step([a, b], prompt=10) is None


def test_a_window_of_fewer_than_three_tokens_is_none():
    a = _stream(0.0, 20, 0.001)
    b = _stream(0.0185, 10, 0.001)  # A's last token at 19 ms: B has 1 token inside
    assert together_step([a, b], prompt=10) is None
