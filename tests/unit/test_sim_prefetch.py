"""The simulator's tool calls and prefetch: turns wait out the trace's tool calls; hinted agents'
stored KV is read during them (the mesh's own planner), so their turns after a tool call get their
first token sooner; unhinted agents in a mixed run keep their TTFT; the oracle ignores hints."""
from __future__ import annotations

import pytest

from dualpath.sim.config import SimConfig
from dualpath.sim.engine import run_sim

pytestmark = pytest.mark.unit
BASE = dict(P=1, D=2, trace="gen:32k:12", agents=12, scale=0.1, seed=0, progress=False)


@pytest.fixture(scope="module")
def runs():
    return {h: run_sim(SimConfig(mode="dualpath", hints=h, tool_calls=1.0, **BASE)) for h in ("off", "on", "mixed")}


def test_tool_calls_stretch_the_run_and_every_later_turn_follows_one(runs):
    plain = run_sim(SimConfig(mode="dualpath", **BASE))
    assert runs["off"].jct_s > 3 * plain.jct_s  # seconds of tool calls between turns
    assert not plain.after_tool
    a = runs["off"].after_tool
    assert a["unhinted_turns"] == runs["off"].requests - 12  # all but each agent's first turn


def test_hinted_turns_are_served_from_the_prefetch_and_get_their_first_token_sooner(runs):
    off, on = runs["off"].after_tool, runs["on"].after_tool
    assert runs["on"].prefetched_gb > 0 and runs["off"].prefetched_gb == 0
    assert on["hinted_turns"] == off["unhinted_turns"] and "unhinted_turns" not in on
    assert on["hinted_ttft_p50_s"] < off["unhinted_ttft_p50_s"]
    assert on["hinted_ttft_p99_s"] <= off["unhinted_ttft_p99_s"]


def test_a_mixed_run_prefetches_for_half_the_agents_and_spares_the_others(runs):
    mixed, off = runs["mixed"], runs["off"].after_tool
    assert 0 < mixed.prefetched_gb < runs["on"].prefetched_gb
    assert mixed.after_tool["hinted_turns"] > 0 and mixed.after_tool["unhinted_turns"] > 0
    assert mixed.after_tool["unhinted_ttft_p50_s"] <= 1.05 * off["unhinted_ttft_p50_s"]


def test_the_oracle_and_bad_settings():
    with pytest.raises(ValueError, match="hints"):
        SimConfig(hints="sometimes")
    with pytest.raises(ValueError, match="tool_calls"):
        SimConfig(tool_calls=-1)
    assert run_sim(SimConfig(mode="oracle", hints="on", tool_calls=1.0, **BASE)).prefetched_gb == 0
