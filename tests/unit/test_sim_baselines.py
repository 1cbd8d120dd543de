"""The SGLang + Mooncake-style baseline, prefill without layerwise loading, and the ablation command."""
from dataclasses import replace

import pytest

from dualpath.cli import main
from dualpath.sim import ablation
from dualpath.sim.config import SimConfig
from dualpath.sim.engine import Simulation, run_sim

pytestmark = pytest.mark.unit
# on the kernels' own rates (efficiency 1): storage weighs most at this small size
SMALL = SimConfig(model="ds-v3.2-660b", P=1, D=2, trace="gen:32k:20", agents=120, scale=0.25, pe_ep_nodes=1,
                  prefill_eff=1.0, decode_eff=1.0)


@pytest.fixture(scope="module")
def runs():
    return {name: run_sim(cfg) for name, cfg in (
        ("basic", replace(SMALL, mode="basic")),
        ("whole first", replace(SMALL, mode="basic", layerwise=False)),
        ("sglang", replace(SMALL, mode="sglang")))}


def test_loading_the_whole_prompt_before_compute_costs_time(runs):
    assert runs["whole first"].jct_s > runs["basic"].jct_s
    assert runs["whole first"].ttft_p50_s > runs["basic"].ttft_p50_s


def test_the_sglang_baseline_reads_on_the_prefill_path_only_and_ignores_read_queues(runs):
    sg = runs["sglang"]
    assert sum(sg.snic_read_gb[1:]) == 0.0  # decode nodes read nothing
    sim = Simulation(replace(SMALL, mode="sglang"))
    assert sim.sched.rr and sim.whole_first  # round-robin engines, no layerwise overlap
    assert sg.requests == runs["basic"].requests


def test_the_ablation_adds_one_technique_a_step():
    steps = ablation.configs(SMALL)
    kinds = [(c.mode, c.whole_prompt_first, c.assign_kind) for _, c in steps]
    assert kinds == [("basic", True, "rr"), ("basic", False, "rr"), ("dualpath", False, "rr"),
                     ("dualpath", False, "policy")]
    table = ablation.rows([100.0, 80.0, 60.0, 50.0])
    assert [round(change, 6) for _, _, change, _ in table] == [0.0, -20.0, -40.0, -50.0]
    text = ablation.format_rows(table)
    assert "-17.21%" in text and "-45.62%" in text and "+ scheduler" in text


def test_the_cli_runs_an_sglang_mode(capsys):
    rc = main(["sim", "--model", "ds-27b", "--topology", "1P1D", "--trace", "gen:32k:10", "--agents", "10",
               "--scale", "0.2", "--modes", "sglang,dualpath", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and "sglang" in out and "TTST p50" in out and "CNIC lanes" in out
