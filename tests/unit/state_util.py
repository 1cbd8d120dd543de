"""Assertions every state machine's tests share."""
from __future__ import annotations

import pytest

from shared.states import IllegalTransition


def assert_illegal(life, rec, path) -> None:
    """Move `rec` along `path` but its last state, which must be refused: raised with its fields,
    counted, and nothing changed."""
    *ok, bad = path
    for s in ok:
        life.move(rec, s)
    before, counts = rec.state, dict(life.counts)
    with pytest.raises(IllegalTransition) as e:
        life.move(rec, bad)
    assert (e.value.req_id, e.value.src, e.value.dst) == (rec.req_id, before, bad)
    assert life.illegal == 1 and rec.state == before and dict(life.counts) == counts
