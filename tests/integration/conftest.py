"""Fixtures shared by the integration tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def reference():
    """The tiny model in this process: the single-process oracle the mesh's outputs are compared to."""
    import torch

    from shared.model.loader import load_model

    torch.set_num_threads(1)
    return load_model("tiny", seed=0)
