"""The traffic manager's fault-injection switch: refused unless the environment allows faults,
and when on it corrupts exactly one layer of one block (the exactness tests' teeth)."""
from __future__ import annotations

import numpy as np
import pytest

from services.traffic_manager.config import ALLOW_FAULTS, TrafficManagerConfig
from services.traffic_manager.store_path import flip_layer_signs
from shared.config import ConfigError
from shared.messages.storage_gateway import StoreLayout

pytestmark = pytest.mark.unit


def test_the_switch_is_refused_unless_faults_are_allowed(monkeypatch):
    monkeypatch.delenv(ALLOW_FAULTS, raising=False)
    with pytest.raises(ConfigError, match="fault_flip_de_bytes"):
        TrafficManagerConfig(engine="e0", fault_flip_de_bytes=True).validate()
    TrafficManagerConfig(engine="e0").validate()  # off: fine anywhere
    monkeypatch.setenv(ALLOW_FAULTS, "1")
    TrafficManagerConfig(engine="e0", fault_flip_de_bytes=True).validate()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_flip_negates_the_middle_layer_of_one_block_only(dtype):
    import torch

    layout = StoreLayout(fingerprint=bytes(16), model_id="m", n_layers=4, n_kv_heads=2, head_dim=8, dtype=dtype,
                         block_size=4)
    t = getattr(torch, dtype)
    blocks = torch.randn(3, 4, 2, 4, 2, 8).to(t)  # [block, layer, kv, row, head, dim]
    raw = bytearray(blocks.view(-1).view(torch.uint8).numpy().tobytes())
    block_nbytes = len(raw) // 3
    flip_layer_signs(memoryview(raw), block_nbytes, layout)  # the second block
    after = torch.frombuffer(raw, dtype=t).view(blocks.shape)
    want = blocks.clone()
    want[1, 2] = -want[1, 2]
    assert torch.equal(after, want)
    assert not np.array_equal(np.frombuffer(raw, np.uint8), blocks.view(-1).view(torch.uint8).numpy())
