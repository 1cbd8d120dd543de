"""Bench workloads: scaled generated traces keep their statistics; modes share no tokens."""
import pytest

from dualpath.bench.workload import expected_hit_tokens, jobs, load, token_range
from dualpath.traces import Trajectory, trace_stats, write_trajectories

pytestmark = pytest.mark.unit


def test_scaled_generated_trace_keeps_turns_and_hit_ratio():
    full, small = load("gen:32k", 60, 1.0), load("gen:32k", 60, 0.1)
    f, s = trace_stats(list(full.trajectories)), trace_stats(list(small.trajectories))
    assert s.turns == f.turns
    assert s.total == pytest.approx(0.1 * f.total, rel=0.02)
    assert s.hit_ratio == pytest.approx(f.hit_ratio, abs=0.05)
    assert small.trajectories[0].meta["max_len"] == int(32768 * 0.1)


def test_jobs_follow_the_trajectory_and_modes_share_no_prefix():
    w = load("gen:48k", 3, 0.05)
    by_mode = {m: jobs(w, m, 32, 127, seed=5) for m in ("basic", "dualpath", "oracle")}
    for m, js in by_mode.items():
        assert len(js) == 3 and all(j.mode == m for j in js)
        assert [len(a) for a, _ in js[0].turns] == [a for a, _ in w.trajectories[0].turns]
        assert js[0].prompt_lengths == w.trajectories[0].prompts()
    firsts = [by_mode[m][0].turns[0][0][:64] for m in by_mode]
    assert len(set(firsts)) == 3
    assert jobs(w, "basic", 32, 127, seed=5) == by_mode["basic"]  # deterministic per seed


def test_jobs_stop_before_the_context_limit():
    w = load("gen:32k", 2, 0.2)
    for j in jobs(w, "dualpath", 32, 127, max_context=2000):
        assert len(j.turns) >= 1
        ctx = 0
        for a, g in j.turns:
            ctx += len(a) + g
        assert ctx <= 2000


def test_trajectory_file_with_scale_and_copies(tmp_path):
    p = tmp_path / "t.jsonl"
    write_trajectories(p, [Trajectory("a", ((200, 20), (100, 10)))])
    w = load(str(p), 3, 0.5)
    js = jobs(w, "dualpath", 100, 900)
    assert [len(a) for a, _ in js[0].turns] == [100, 50] and js[0].turns[0][1] == 10
    assert js[1].turns[0][1] == 1 and len(js[1].turns) == 3  # copies get a synthetic first round
    assert expected_hit_tokens(js[0], 64) == 64  # turn 2 reuses the one full block of 110 tokens


def test_token_range_avoids_special_ids():
    assert token_range("tiny2@seed0", 259) == (32, 127)
    lo, hi = token_range("smollm2", 49152)
    assert lo >= 3 and hi <= 49152 - 1000


def test_set_flags_name_a_service_and_a_setting():
    from dualpath.bench.cli import _settings
    from dualpath.cli import CliError

    assert _settings(["scheduler.pe-beta-tokens=32768", "storage-gateway.io_threads=2"]) == [
        ("scheduler", "pe-beta-tokens", "32768"), ("storage_gateway", "io-threads", "2")]
    for bad in ("pe-beta-tokens=1", "gateway.x=1", "scheduler.=3", "decode_engine.handoff-timeout-s=9"):
        with pytest.raises(CliError, match="--set"):
            _settings([bad])


def test_an_online_level_replays_enough_agents_for_its_turns_and_its_duration():
    from dualpath.bench.runs import agents_for_level

    assert agents_for_level(2.0, 0, 0, 12, 6) == 12  # --agents alone
    assert agents_for_level(2.0, 0, 120, 12, 6) == 20  # 120 turns of 6
    assert agents_for_level(2.0, 60, 120, 12, 6) == 120  # arrivals over 60 s at 2 APS
    assert agents_for_level(22.6, 60, 120, 12, 6) == 1356
    assert agents_for_level(0.5, 3, 0, 0, 6) == 2  # rounded up, never a fraction of an agent


def test_negative_level_floors_are_refused_by_name():
    from dualpath.cli import main

    for flag in ("--min-seconds", "--min-turns"):
        with pytest.raises(SystemExit) as exc:
            main(["bench", "--trace", "gen:32k", "--aps", "1", flag, "-3"])
        assert exc.value.code == 2
