"""The bench's agent-hint runs: jobs carry tool calls and hints, turns after a tool call are split
hinted / unhinted, and the ratios against oracle and the hints-off run come out right."""
from __future__ import annotations

import pytest

from dualpath.bench import hints
from dualpath.bench.replay import RunResult, TurnResult
from dualpath.bench.workload import jobs, load, with_hints
from shared.messages.codes import LoadMode

pytestmark = pytest.mark.unit


def test_jobs_carry_the_tool_calls_and_hint_every_turn_until_the_release():
    wl = load("gen:32k", 2, 0.02, seed=1, tool_scale=0.5)
    js = with_hints(jobs(wl, LoadMode.DUALPATH, 32, 127, seed=1), "mixed")
    assert [j.hinted for j in js] == [True, False]
    j = js[0]
    assert len(j.tool_s) == len(j.turns) - 1 and all(t > 0 for t in j.tool_s)
    base = wl.trajectories[wl.agents[0][0]]
    assert j.tool_s[0] == pytest.approx(base.tool_ms[0] / 1000 * 0.5)
    assert j.hints(0) == {"session_id": j.id, "expected_tool_duration_ms": round(j.tool_s[0] * 1000)}
    assert j.hints(len(j.turns) - 1) == {"session_id": j.id, "release": True}
    assert js[1].hints(0) is None
    assert all(not j.tool_s for j in jobs(load("gen:32k", 2, 0.02, seed=1), LoadMode.DUALPATH, 32, 127))
    with pytest.raises(ValueError, match="hints must be"):
        with_hints(js, "sometimes")


def _run(mode, rows):
    r = RunResult(mode, "offline", None)
    for k, (ttft, hinted, tool) in enumerate(rows):
        r.turns.append(TurnResult("j", k, 100, 4, 0.0, ttft, float("nan"), 1.0, 0, hinted=hinted, after_tool_s=tool))
    return r


def test_only_turns_after_a_tool_call_count_split_by_hinting_and_the_ratios():
    on = {"mode": "dualpath", "hints": "mixed", **hints.turn_figures(_run(LoadMode.DUALPATH, [
        (9.0, True, 0.0), (1.2, True, 2.0), (1.2, True, 2.0), (2.1, False, 2.0), (2.1, False, 2.0)]))}
    assert (on["hinted_turns"], on["unhinted_turns"]) == (2, 2)  # the first turn had no tool call before it
    assert on["hinted_ttft_p50_s"] == 1.2 and on["unhinted_ttft_p99_s"] == pytest.approx(2.1)
    off = {"mode": "dualpath", "hints": "off", **hints.turn_figures(_run(LoadMode.DUALPATH, [(2.0, False, 2.0)]))}
    oracle = {"mode": "oracle", "hints": "off", **hints.turn_figures(_run(LoadMode.ORACLE, [(1.0, False, 2.0)]))}
    rat = hints.ratios([on, off, oracle])
    assert rat["dualpath/mixed: hinted / oracle TTFT p50"] == pytest.approx(1.2)
    assert rat["dualpath/mixed: unhinted / hints-off unhinted TTFT p50"] == pytest.approx(1.05)
    assert rat["dualpath/off: unhinted / oracle TTFT p99"] == pytest.approx(2.0)
    lines = hints.markdown({"runs": [on, off, oracle], "hint_ratios": rat})
    assert lines[0].startswith("## Agent hints") and any("| dualpath | mixed |" in x for x in lines)


def test_with_repeats_each_ratio_is_paired_within_a_repeat_and_the_median_reported():
    def row(mode, policy, repeat, ttft, hinted):
        figs = hints.turn_figures(_run(LoadMode(mode), [(ttft, hinted, 2.0)]))
        return {"mode": mode, "hints": policy, "repeat": repeat, **figs}

    runs = []
    for k, (hinted, oracle) in enumerate([(1.1, 1.0), (3.0, 2.0), (0.9, 1.0)]):  # ratios 1.1, 1.5, 0.9
        runs += [row("dualpath", "on", k, hinted, True), row("oracle", "off", k, oracle, False)]
    each = hints.ratios_each(runs)
    assert each["dualpath/on: hinted / oracle TTFT p50"] == pytest.approx([1.1, 1.5, 0.9])
    rat = hints.ratios(runs)
    assert rat["dualpath/on: hinted / oracle TTFT p50"] == pytest.approx(1.1)  # not 3.0 / 1.0 of mixed repeats
    lines = hints.markdown({"runs": runs, "hint_ratios": rat, "hint_ratios_each": each})
    assert any("1.10x (median of 3: 1.10, 1.50, 0.90)" in x for x in lines), lines
