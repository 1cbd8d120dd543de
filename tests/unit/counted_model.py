"""An attention-time model that counts its evaluations: a chunk search that never ends fails at once."""
from __future__ import annotations

import pytest

from shared.sched.policy import AttentionModel


class Counted(AttentionModel):
    """Counts its evaluations; a chunk search that never ends fails at once instead of hanging the suite."""

    calls = 0
    LIMIT = 10_000

    def request_time(self, cached: int, bsz: int) -> float:
        Counted.calls += 1
        if Counted.calls > Counted.LIMIT:
            raise AssertionError(f"over {Counted.LIMIT} attention-time evaluations: the chunk search does not end")
        return super().request_time(cached, bsz)


@pytest.fixture(autouse=True)
def fresh_count():
    Counted.calls = 0
