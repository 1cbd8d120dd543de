"""The simulator fitted to a running mesh: its probed rates in, each mode's predicted offline JCT out.

`predict` builds a cluster of the mesh's shape from `MeshRates` and replays the bench's turn
lengths; the engines' contention on the shared host is what the bench probed of it (hostcpu.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from dualpath.sim.config import SimConfig
from dualpath.sim.hardware import Hardware
from dualpath.sim.models import SimModel
from shared.sched.policy import AttentionModel, PeThresholds

UNCAPPED = 100e9  # bytes/s standing in for a link that has no cap
PE_QUOTA_S = 4.0  # the prefill engine's compute quota (services/prefill_engine/config.py)


@dataclass(frozen=True)
class MeshRates:
    prefill_tok_s: float  # one prefill engine, tokens/s, beyond its fixed cost per turn
    turn_overhead_s: float  # fixed cost of a turn (front door, scheduling, messages, first step)
    decode_step_s: float  # one decode step with one sequence
    decode_per_seq_s: float  # added per further sequence in the step
    snic_bytes_s: float | None  # per node (None: uncapped)
    data_plane_bytes_s: float  # between engines (and host <-> engine memory)
    kv_bytes_per_token: float
    block_tokens: int
    prefill_nodes: int
    decode_nodes: int
    kv_tokens_per_engine: int
    alpha_tokens: int
    beta_tokens: int
    kv_cpu_s_per_byte: float = 0.0  # CPU s the KV path takes from a node's engine per storage byte (0: own cores)
    decode_per_ctx_s: float = 0.0  # a decode step's added seconds per context token of its batch
    decode_probe_ctx: int = 0  # context tokens of the sequences the decode step was probed with
    host_cores: int = 0  # cores every engine shares (0: each has its own)
    background_cores: float = 0.0  # of them, what the mesh's other processes keep busy
    corun_prefill_slow: float = 1.0  # a prefill's time while the decode engine steps beside it, over alone
    corun_decode_slow: float = 1.0  # a decode step's time while the prefill engine computes beside it, over alone


def mesh_hardware(r: MeshRates) -> Hardware:
    gbit = lambda b: b * 8 / 1e9  # noqa: E731  (Hardware takes Gbit/s)
    return Hardware(name="mesh", gpus=1, cnic_gbps=gbit(r.data_plane_bytes_s),
                    snic_gbps=gbit(r.snic_bytes_s or UNCAPPED), dram_gbs=UNCAPPED / 1e9, link_eff=1.0)


def mesh_model(r: MeshRates, overhead_in_forward: float = 1.0) -> SimModel:
    """The mesh's engines as a SimModel: a prefill forward costs `overhead_in_forward` of the fixed
    cost plus its tokens at the probed rate; a decode step a + b * (batch - 1) + c per extra context token."""
    kvb = max(1, round(r.kv_bytes_per_token))
    ctx_s = r.decode_per_ctx_s * r.decode_probe_ctx  # the probed steps' own share of per-context cost
    per_seq = max(0.0, r.decode_per_seq_s - ctx_s)
    att = AttentionModel(per_token=1.0 / r.prefill_tok_s, per_batch=r.turn_overhead_s * overhead_in_forward)
    return SimModel(
        name="mesh", kv_bytes=kvb, kv_main_bytes=kvb, kv_index_bytes=0, topk=0, moe=False,
        linear_s_per_token=0.0, pooled_fraction=0.0, attention=att,
        prefill_comm_bytes=0.0, weight_bytes=0.0, hbm_bytes=0.0, capacity_tokens=r.kv_tokens_per_engine,
        d_overhead_s=r.decode_step_s - per_seq - ctx_s, d_gemm_s_per_token=per_seq, d_weights_s=0.0,
        d_att_s_per_capped=0.0, d_att_s_per_ctx=r.decode_per_ctx_s, d_kv_s_per_capped=0.0, d_kv_s_per_ctx=0.0,
        decode_comm_bytes=0.0, comm_latency_s=0.0)


FORWARD_SHARE = 1.0  # of a turn's fixed cost, the share spent in the prefill engine's forward


def predict(r: MeshRates, trajectories: list[list[tuple[int, int]]], modes: list[str],
            forward_share: float = FORWARD_SHARE, shared_cores: bool = True,
            write_lag: bool = True) -> dict[str, float]:
    """Predicted offline JCT (s) of each mode for these jobs' (append, gen) turns; `shared_cores`
    charges the KV path's CPU to the engines, `write_lag` hits only blocks already written."""
    return {mode: simulate(r, trajectories, mode, forward_share, shared_cores, write_lag).jct_s for mode in modes}


def simulate(r: MeshRates, trajectories: list[list[tuple[int, int]]], mode: str,
             forward_share: float = FORWARD_SHARE, shared_cores: bool = True, write_lag: bool = True):
    """The SimResult of one mode (`predict`'s run, with its TTFT / TPOT and engines' busy shares)."""
    from dualpath.sim.engine import Simulation
    from dualpath.sim.workload import from_turns

    shared = shared_cores and r.host_cores > 0
    cfg = SimConfig(model="mesh", hardware=mesh_hardware(r), P=r.prefill_nodes, D=r.decode_nodes,
                    agents=len(trajectories), mode=mode, pull_s=0.005, quota_s=PE_QUOTA_S, chunk_align=16,
                    block_tokens=r.block_tokens, think_s=r.turn_overhead_s * (1 - forward_share),
                    pe_ep_nodes=1, de_ep_nodes=1, model_traffic=0.0,
                    kv_cpu_s_per_byte=r.kv_cpu_s_per_byte if shared_cores else 0.0,
                    host_cores=r.host_cores if shared else 0, background_cores=r.background_cores,
                    host_corun_prefill=max(1.0, r.corun_prefill_slow) if shared else 1.0,
                    host_corun_decode=max(1.0, r.corun_decode_slow) if shared else 1.0, write_lag=write_lag)
    sim = Simulation(cfg, mesh_model(r, forward_share), from_turns([tuple(t) for t in trajectories], r.block_tokens),
                     thresholds=PeThresholds(alpha=r.alpha_tokens, beta=r.beta_tokens))
    return sim.run()
