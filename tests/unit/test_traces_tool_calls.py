"""Tool-call durations in trajectories: the optional `tool_ms` field (checked, round-tripped) and the
generator's draw (seconds typically, a long tail, the same turns with or without it)."""
from __future__ import annotations

import numpy as np
import pytest

from dualpath.traces import TraceFormatError, generate, read_trajectories, with_tool_calls, write_trajectories
from dualpath.traces.format import parse_line
from dualpath.traces.generator import TOOL_CLIP_S

pytestmark = pytest.mark.unit


def test_tool_ms_round_trips_and_gives_seconds_per_gap(tmp_path):
    t = parse_line('{"id": "a", "turns": [[10, 2], [3, 4], [5, 6]], "tool_ms": [1500, 0], "max_len": 99}')
    assert t.tool_ms == (1500, 0) and t.meta == {"max_len": 99}
    assert (t.tool_s(0), t.tool_s(1), t.tool_s(2)) == (1.5, 0.0, 0.0)
    write_trajectories(tmp_path / "t.jsonl", [t])
    assert read_trajectories(tmp_path / "t.jsonl")[0].tool_ms == (1500, 0)
    assert parse_line('{"turns": [[10, 2]]}').tool_ms == ()


@pytest.mark.parametrize("line, why", [
    ('{"turns": [[10, 2], [3, 4]], "tool_ms": [1, 2]}', "one duration per gap"),
    ('{"turns": [[10, 2], [3, 4]], "tool_ms": [-1]}', "tool_ms"),
    ('{"turns": [[10, 2], [3, 4]], "tool_ms": ["1s"]}', "tool_ms"),
])
def test_bad_tool_ms_names_the_line_and_field(line, why):
    with pytest.raises(TraceFormatError, match=why) as err:
        parse_line(line, "f.jsonl", 7)
    assert err.value.line == 7


def test_generated_tool_calls_are_seconds_long_seeded_and_leave_the_turns_alone():
    plain = generate("32k", 20, seed=3, scale=0.1)
    tools = generate("32k", 20, seed=3, scale=0.1, tools=True)
    assert [t.turns for t in plain] == [t.turns for t in tools]
    assert all(len(t.tool_ms) == len(t.turns) - 1 for t in tools)
    s = np.array([ms for t in tools for ms in t.tool_ms]) / 1000
    assert 1.0 < np.median(s) < 4.0 and np.percentile(s, 90) > 2 * np.median(s)  # seconds, with a tail
    assert s.min() >= TOOL_CLIP_S[0] and s.max() <= TOOL_CLIP_S[1]
    assert tools == generate("32k", 20, seed=3, scale=0.1, tools=True)
    assert with_tool_calls(tools, seed=9) == tools  # recorded durations are kept
