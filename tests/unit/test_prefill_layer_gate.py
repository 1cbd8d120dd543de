"""The prefill engine's layer gate reports a layer to the hand-off only once the layer is over, its
attention included: the traffic-manager may then push it and reuse a hit window's slots (reported
at the next layer's start, the last at the end of the forward)."""
from __future__ import annotations

import pytest

from services.prefill_engine.layers import LayerGate, LoadProgress

pytestmark = pytest.mark.unit


def test_a_layer_is_reported_when_the_next_one_starts_and_the_last_at_the_end():
    seen: list[tuple[str, int]] = []
    load = LoadProgress("r")
    gate = LayerGate([load], timeout=5.0, on_computed=lambda layer: seen.append(("computed", layer)))
    for layer in range(3):
        load.mark(layer)
        gate.before_layer(layer)
        seen.append(("writes its KV", layer))
        gate.after_layer(layer)
        seen.append(("attention reads the hits", layer))
    gate.finish(3)
    assert seen == [("writes its KV", 0), ("attention reads the hits", 0), ("computed", 0),
                    ("writes its KV", 1), ("attention reads the hits", 1), ("computed", 1),
                    ("writes its KV", 2), ("attention reads the hits", 2), ("computed", 2)]
