"""The KV path's CPU taken from a node's engine (dualpath/sim/hostcpu.py): the right engine, by the probed amount."""
from __future__ import annotations

import pytest

from dualpath.bench.kvcpu import first_tokens, per_byte
from dualpath.sim.calibrate import MeshRates, predict
from dualpath.sim.config import SimConfig
from dualpath.sim.decode import DecodeState
from dualpath.sim.hostcpu import KvCpu, moved
from dualpath.sim.resources import Link
from dualpath.sim.workload import from_turns

pytestmark = pytest.mark.unit

RATES = MeshRates(prefill_tok_s=2000.0, turn_overhead_s=0.05, decode_step_s=0.01, decode_per_seq_s=0.002,
                  snic_bytes_s=1e6, data_plane_bytes_s=1e9, kv_bytes_per_token=1000.0, block_tokens=16,
                  prefill_nodes=1, decode_nodes=1, kv_tokens_per_engine=100_000, alpha_tokens=50_000,
                  beta_tokens=4096)
C = 1e-7  # s per storage byte: 0.1 s per MB


def test_a_link_has_moved_what_it_booked_less_its_backlog():
    link = Link("l", 1e6)
    link.reserve(0.0, 2e6)  # busy until t = 2
    assert moved(link, 0.5) == pytest.approx(0.5e6)
    assert moved(link, 5.0) == pytest.approx(2e6)


def test_take_charges_each_byte_once():
    r, w = Link("r", 1e6), Link("w", 1e6)
    kv = KvCpu(C)
    r.reserve(0.0, 1e6)
    w.reserve(0.0, 0.5e6)
    assert kv.take(7, r, w, 10.0) == pytest.approx(C * 1.5e6)
    assert kv.take(7, r, w, 11.0) == 0.0


def test_a_stalled_decode_batch_finishes_later_by_the_stall():
    from dualpath.sim.calibrate import mesh_model

    d: DecodeState[str] = DecodeState(mesh_model(RATES))
    d.join(0.0, 1, "a", 100, 10)
    alone = d.next_finish()
    d.stall(0.02, 0.3)
    assert d.next_finish() == pytest.approx(alone + 0.3)
    assert d.pop_finished(alone + 0.1) == []  # still standing or stepping
    assert d.pop_finished(alone + 0.3 + 1e-9) == ["a"]


def _sim():
    from dualpath.sim.calibrate import mesh_hardware, mesh_model
    from dualpath.sim.engine import Simulation
    from shared.sched.policy import PeThresholds

    cfg = SimConfig(model="mesh", hardware=mesh_hardware(RATES), P=1, D=1, agents=1, mode="dualpath", pull_s=0.005,
                    quota_s=4.0, chunk_align=16, block_tokens=16, pe_ep_nodes=1, de_ep_nodes=1, model_traffic=0.0,
                    kv_cpu_s_per_byte=C)
    return Simulation(cfg, mesh_model(RATES), from_turns([((16, 2),)], 16), thresholds=PeThresholds(50_000, 4096))


def test_bytes_the_decode_node_moved_stall_its_running_batch_not_the_prefill_engine():
    sim = _sim()
    de, unit = sim.c.des[0], sim.c.units[0]
    d = de.decode
    d.join(0.0, 1, "a", 100, 500)
    alone = d.next_finish()
    de.node.snic_r.reserve(0.0, 1e6)  # 1 MB read on the decode node's path, through by t = 1
    sim.now = 1.0
    sim._kv_stall(de)
    assert d.next_finish() == pytest.approx(alone + C * 1e6)
    assert unit.busy_s == 0.0 and sim.heap == []  # the prefill engine pays nothing
    sim._kv_stall(de)  # nothing moved since: nothing more
    assert d.next_finish() == pytest.approx(alone + C * 1e6)


def test_bytes_the_prefill_node_moved_during_a_forward_stretch_it():
    sim = _sim()
    unit, node = sim.c.units[0], sim.c.pe_nodes[0]
    unit.busy, unit.t_start = True, 0.0
    sim._kv_owed(unit)  # the step starts: nothing owed yet
    node.snic_r.reserve(0.0, 0.5e6)
    node.snic_w.reserve(0.0, 0.25e6)
    sim.now = 1.0
    sim._step_end(unit)
    t, _, fn, arg = sim.heap[0]
    assert (fn, arg) == (sim._step_end, unit) and t == pytest.approx(1.0 + C * 0.75e6)
    assert unit.busy and unit.busy_s == pytest.approx(C * 0.75e6)
    assert sim.c.des[0].decode.version == 0  # the decode engine pays nothing


def test_bytes_moved_while_the_engine_idles_cost_nothing():
    sim = _sim()
    de = sim.c.des[0]
    de.node.snic_r.reserve(0.0, 1e6)
    sim.now = 2.0
    sim._kv_stall(de)  # no batch runs: the core was free
    de.decode.join(2.0, 1, "a", 100, 10)
    alone = de.decode.next_finish()
    sim._kv_stall(de)
    assert de.decode.next_finish() == alone


def test_the_probed_cost_decides_the_prediction_and_zero_changes_nothing():
    agents = [[(1600, 20), (16, 20), (16, 20)] for _ in range(3)]
    shared = MeshRates(**{**vars(RATES), "kv_cpu_s_per_byte": C})
    base = predict(RATES, agents, ["basic", "dualpath", "oracle"], write_lag=False)  # the same hits throughout
    assert predict(shared, agents, ["basic", "dualpath", "oracle"], shared_cores=False, write_lag=False) == base
    got = predict(shared, agents, ["basic", "dualpath", "oracle"], write_lag=False)
    assert got["oracle"] == base["oracle"]  # the oracle moves no KV
    assert got["basic"] > base["basic"] and got["dualpath"] > base["dualpath"]


def test_the_probe_counts_only_the_kv_runs_cpu_beyond_the_oracles_and_the_idle_mesh():
    assert per_byte(5.0, 3.0, 1e8) == pytest.approx(2e-8)
    assert per_byte(5.0, 3.0, 1e8, idle_cpu=0.5, extra_wall_s=2.0) == pytest.approx(1e-8)
    assert per_byte(3.0, 4.0, 1e8) == 0.0 and per_byte(5.0, 3.0, 0.0) == 0.0
    # prompt tokens the KV run computed again (its turns came before their blocks were written)
    # are the engine's prefill, not the KV path's
    assert per_byte(5.0, 3.0, 1e8, recompute_cpu_s=1.5) == pytest.approx(5e-9)
    assert per_byte(5.0, 3.0, 1e8, recompute_cpu_s=3.0) == 0.0


def test_the_probe_workload_fits_a_slow_storage_nic_and_leaves_a_fast_one_alone():
    # SmolLM2 fp32: 2.95 MB a block of 64 tokens behind 0.05 Gbit/s: 4 agents x 3 turns
    # of 1,024 tokens would move ~570 MB (~90 s a mode); sized to 20 s: 192 tokens, 3 blocks
    smol = 2_949_120 / 64
    assert first_tokens(8192, 3, 8, 4, smol, 0.05e9 / 8) == 192
    assert first_tokens(8192, 3, 8, 4, smol, 0.05e9 / 8, budget_s=1.0) == 128  # two blocks at least
    assert first_tokens(8192, 3, 8, 4, 2_048, 0.1e9 / 8) == 1024  # a tiny model's KV: as before
    assert first_tokens(8192, 3, 8, 4, smol, None) == 1024  # no cap: as before
    assert first_tokens(512, 3, 8, 4) == 128  # half a short context, 128 at least


def test_config_rejects_a_negative_cost():
    with pytest.raises(ValueError, match="kv_cpu_s_per_byte"):
        SimConfig(kv_cpu_s_per_byte=-1.0)


def test_the_host_pool_slows_engines_only_when_they_and_the_rest_want_more_than_its_cores():
    from dualpath.sim.hostcpu import HostPool

    pool = HostPool(2.0, 0.5)
    assert pool.slow(1) == 1.0
    assert pool.slow(2) == pytest.approx(1.25)
    assert HostPool(2.0).slow(2) == 1.0  # two engines on two cores and nothing else: no contention


def test_a_decode_batch_steps_slower_while_the_prefill_engine_computes_beside_it():
    cfg_rates = MeshRates(**{**vars(RATES), "host_cores": 2, "background_cores": 0.5})
    agents = [[(16, 400)], [(1600, 4), (1600, 4), (1600, 4)]]  # one decodes while the other prefills
    alone = predict(RATES, agents, ["oracle"])["oracle"]
    shared = predict(cfg_rates, agents, ["oracle"])["oracle"]
    assert predict(cfg_rates, agents, ["oracle"], shared_cores=False)["oracle"] == alone
    assert shared > alone


def test_set_slow_stretches_the_remaining_steps():
    from dualpath.sim.calibrate import mesh_model

    d: DecodeState[str] = DecodeState(mesh_model(RATES))
    d.join(0.0, 1, "a", 100, 100)  # 100 steps of 10 ms
    assert d.next_finish() == pytest.approx(1.0)
    d.set_slow(0.5, 2.0)  # half done: the other half at twice the time
    assert d.next_finish() == pytest.approx(1.5)


def test_engines_computing_at_once_take_the_probed_co_run_slowdown_of_their_kind():
    from dualpath.sim.hostcpu import DECODE, PREFILL, HostPool

    pool = HostPool(2.0, 0.0, corun_prefill=1.4, corun_decode=1.8)
    assert pool.slow(1, PREFILL) == pool.slow(1, DECODE) == 1.0  # alone: as probed
    assert pool.slow(2, PREFILL) == pytest.approx(1.4) and pool.slow(2, DECODE) == pytest.approx(1.8)
    assert HostPool(2.0, 1.0, 1.2, 1.2).slow(2, DECODE) == pytest.approx(1.5)  # time-slicing, when it costs more


def _mesh_sim(agents, **host):
    from dualpath.sim.calibrate import mesh_hardware, mesh_model
    from dualpath.sim.engine import Simulation
    from shared.sched.policy import PeThresholds

    cfg = SimConfig(model="mesh", hardware=mesh_hardware(RATES), P=1, D=1, agents=len(agents), mode="oracle",
                    pull_s=0.005, quota_s=4.0, chunk_align=16, block_tokens=16, pe_ep_nodes=1, de_ep_nodes=1,
                    model_traffic=0.0, host_cores=2, **host)
    return Simulation(cfg, mesh_model(RATES), from_turns([tuple(a) for a in agents], 16),
                      thresholds=PeThresholds(50_000, 4096))


def test_beside_a_decoding_batch_a_prefill_takes_the_co_run_slowdown():
    agents = [[(16, 3000)], [(16, 2), (1600, 2)]]  # B's second prompt computes while A decodes for ~30 s
    alone, beside = _mesh_sim(agents), _mesh_sim(agents, host_corun_prefill=1.4)
    alone.run()
    beside.run()
    forward = RATES.turn_overhead_s + (1600 + 2) / RATES.prefill_tok_s  # 16 of its 18 earlier tokens cached
    assert max(alone.ttft) == pytest.approx(forward, abs=0.006)  # two engines on two cores: no time-slicing
    assert max(beside.ttft) == pytest.approx(max(alone.ttft) + 0.4 * forward, abs=1e-6)


def test_beside_a_computing_prefill_engine_a_decode_batch_steps_at_the_co_run_slowdown():
    sim = _mesh_sim([[(16, 2)]], host_corun_decode=1.8)
    d, unit = sim.c.des[0].decode, sim.c.units[0]
    d.join(0.0, 1, "a", 100, 10)
    sim._pool_update()
    assert d.slow == 1.0  # the prefill engine idles
    unit.busy = True
    sim._pool_update()
    assert d.slow == pytest.approx(1.8)
    unit.busy = False
    sim._pool_update()
    assert d.slow == 1.0


def test_config_rejects_a_co_run_speed_up():
    with pytest.raises(ValueError, match="host_corun_prefill"):
        SimConfig(host_corun_decode=0.9)
