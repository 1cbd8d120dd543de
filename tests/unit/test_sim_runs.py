"""Small end-to-end simulations: conservation, mode ordering, CLI JSON shape."""
import json
from dataclasses import replace

import pytest

from dualpath.cli import CliError, main
from dualpath.sim.config import SimConfig
from dualpath.sim.engine import Simulation, run_sim

pytestmark = pytest.mark.unit
# on the kernels' own rates (efficiency 1): a storage-bound setup at this small size
SMALL = SimConfig(model="ds-v3.2-660b", P=1, D=2, trace="gen:32k:40", agents=400, scale=0.25, prefill_eff=1.0,
                  decode_eff=1.0)


@pytest.fixture(scope="module")
def runs():
    return {m: run_sim(replace(SMALL, mode=m)) for m in ("basic", "dualpath", "oracle")}


def test_every_request_finishes_exactly_once(runs):
    total = Simulation(SMALL).w.total_requests
    for r in runs.values():
        assert r.requests == total and r.agents_done == SMALL.agents


def test_storage_bound_ordering_basic_slower_than_dualpath_slower_than_oracle(runs):
    assert runs["basic"].jct_s > 1.05 * runs["dualpath"].jct_s
    assert runs["basic"].ttft_mean_s > 1.5 * runs["dualpath"].ttft_mean_s  # storage queueing
    assert runs["dualpath"].jct_s >= runs["oracle"].jct_s * 0.999
    assert runs["oracle"].snic_read_gb == [0.0, 0.0, 0.0]


def test_basic_reads_only_on_prefill_nodes_dualpath_uses_decode_snics(runs):
    assert sum(runs["basic"].snic_read_gb[1:]) == 0.0
    assert sum(runs["dualpath"].snic_read_gb[1:]) > 0.3 * sum(runs["dualpath"].snic_read_gb)


def test_round_robin_and_split_variants_also_conserve_requests():
    small = replace(SMALL, agents=60)
    total = Simulation(small).w.total_requests
    for cfg in (replace(small, assign="rr"), replace(small, mode="dualpath-split")):
        assert run_sim(cfg).requests == total


def test_cli_writes_the_documented_json(tmp_path, capsys):
    out = tmp_path / "o.json"
    rc = main(["sim", "--model", "ds-27b", "--topology", "1P1D", "--trace", "gen:32k:10",
               "--agents", "10", "--scale", "0.2", "--modes", "basic,dualpath", "--no-progress",
               "--json", str(out)])
    assert rc == 0 and "dualpath" in capsys.readouterr().out
    runs = json.loads(out.read_text())["runs"]
    assert [r["mode"] for r in runs] == ["basic", "dualpath"]
    for key in ("jct_s", "snic_max_over_avg", "attn_max_over_avg", "ttft_p50_s", "tpot_p50_s"):
        assert all(isinstance(r[key], float) for r in runs)


def test_the_read_near_tie_flag_reaches_the_simulated_schedulers_pending_reads(monkeypatch, capsys):
    import dualpath.sim.engine as engine

    class Built(Exception):
        pass

    seen: list[float] = []

    def build_only(cfg):  # the simulation as run_sim would build it, not run
        seen.append(Simulation(cfg).sched.reads.near_tie)
        raise Built

    monkeypatch.setattr(engine, "run_sim", build_only)
    argv = ["sim", "--model", "ds-27b", "--topology", "1P1D", "--trace", "gen:32k:10", "--agents", "10",
            "--modes", "dualpath", "--no-progress"]
    with pytest.raises(Built):
        main([*argv, "--read-near-tie", "0.2"])
    assert seen == [0.2]
    assert Simulation(SimConfig(agents=10, trace="gen:32k:10")).sched.reads.near_tie == SimConfig().read_near_tie
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--read-near-tie", "1"])
    assert exit_.value.code == 2 and "read_near_tie must be in [0, 1), got 1.0" in capsys.readouterr().err


def test_cli_rejects_a_bad_topology():
    from dualpath.sim.cli import parse_topology
    assert parse_topology("48P96D") == (48, 96)
    with pytest.raises(CliError):
        parse_topology("2x4")


def test_balancing_batcher_evens_attention_across_a_step_units_gpus():
    """--attn-balance: the paper's batcher leaves GPUs waiting for the largest batch where they
    hold less ready work than the quota; cutting to the balanced budget evens each step."""
    plain = run_sim(SimConfig(agents=200, scale=0.5)).to_dict()
    bal = run_sim(SimConfig(agents=200, scale=0.5, attn_balance=1.05)).to_dict()
    assert plain["attn_balance"]["steps"] > 0 and bal["attn_balance"]["steps"] > 0
    assert plain["attn_max_over_avg"] > 2.0 and plain["attn_balance"]["wait_share"] > 0.3
    assert bal["attn_max_over_avg"] < 1.2 and bal["attn_balance"]["wait_share"] < 0.1
    assert bal["agents_done"] == plain["agents_done"] == 200 and bal["requests"] == plain["requests"]
