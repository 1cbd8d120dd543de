"""The generator matches the published trace table, is deterministic, and scales lengths."""
import pytest

from dualpath.traces import expand_agents, generate, trace_stats
from dualpath.traces.generator import PUBLISHED

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["32k", "48k", "64k"])
def test_statistics_match_the_published_table(name):
    s = trace_stats(generate(name, 500, seed=0))
    turns, append, gen, total, context = PUBLISHED[name]
    for got, want in ((s.turns, turns), (s.append, append), (s.gen, gen), (s.total, total),
                      (s.context, context)):
        assert got == pytest.approx(want, rel=0.06)
    assert s.max_len <= int(name[:-1]) * 1024
    assert 0.96 < s.hit_ratio < 0.995


def test_seeded_and_independent_of_the_set_size():
    a = generate("32k", 5, seed=3)
    assert a == generate("32k", 5, seed=3)
    assert a[:2] == generate("32k", 2, seed=3)
    assert a != generate("32k", 5, seed=4)


def test_scale_shrinks_lengths_but_keeps_turns_and_hit_ratio():
    full = trace_stats(generate("64k", 200, seed=1))
    small = trace_stats(generate("64k", 200, seed=1, scale=0.25))
    assert small.turns == full.turns
    assert small.total == pytest.approx(full.total * 0.25, rel=0.05)
    assert small.hit_ratio == pytest.approx(full.hit_ratio, abs=0.02)


def test_expand_agents_keeps_the_base_set_then_prepends_a_round():
    agents = expand_agents(3, 10, seed=0)
    assert agents[:3] == [(0, 0), (1, 0), (2, 0)]
    assert all(0 <= b < 3 and 16 <= pre < 128 for b, pre in agents[3:])
    with pytest.raises(ValueError):
        expand_agents(0, 5)
