"""The fault-and-cancel matrix's test tier: a few cells of `python -m dualpath.bench.chaos` on one
tiny mesh under `dualpath up`'s supervisor — each must end its requests (exact, or an error on
the wire), hold nothing afterwards, store no torn block, and serve the next request exactly."""
from __future__ import annotations

import pytest

from dualpath.bench.chaos import Cell, row, run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CELLS = [("decode", "kill", "decode"), ("decode", "freeze", "prefill"), ("tm-d", "kill", "prefill"),
         ("tm-d", "kill", "decode"), ("tm-p", "kill", "prefill"), ("prefill", "kill", "persist"),
         ("nats", "kill", "prefill"), ("client", "leave", "prefill"), ("client", "leave", "decode")]


def test_each_cell_ends_its_requests_frees_everything_and_serves_the_next(tmp_path):
    done = run([Cell(k, a, ph, 0) for k, a, ph in CELLS], log_dir=str(tmp_path / "logs"), say=lambda line: None)
    assert [(c.kind, c.action, c.phase) for c in done] == CELLS
    failed = [row(c) + "".join(f"\n    leak: {x}" for x in c.leaks) for c in done if not c.passed]
    assert not failed, "\n".join(failed)
    killed = [c for c in done if c.action != "leave"]
    assert all(c.stream == "exact" and c.plain == "exact" for c in killed), [row(c) for c in killed]
