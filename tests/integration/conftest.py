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


@pytest.fixture(scope="session")
def netns_hosts():
    """Two hosts as network namespaces on 5 Gbit/s links (tc), torn down at the end; skipped
    with the reason where namespaces cannot be made (not root, no `ip`)."""
    from dualpath.netns.fabric import Fabric, probe
    from dualpath.netns.links import Links

    from .netnsutil import Hosts

    why = probe()
    if why:
        pytest.skip(f"network namespaces: {why}")
    with Fabric() as fabric:
        links = Links(fabric)
        a, b = fabric.add_host("a"), fabric.add_host("b")
        for h in (a, b):
            links.shape(h, gbps=5.0)
        yield Hosts(fabric, links, a, b)


def pytest_sessionfinish(session, exitstatus):
    """No namespace this run made may outlive it (they are named for the creating pid)."""
    import os

    from dualpath.netns.fabric import leftovers

    left = leftovers(os.getpid())
    if left:
        session.exitstatus = 1
        print(f"\nnetwork namespaces left behind by this test run: {left}")
