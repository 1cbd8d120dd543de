"""The simulator's prediction of an offline bench run: each mode's JCT from the rates the bench probed.

Puts `predicted_jct_s` and `measured_over_predicted` on each offline row (None when nothing was probed),
the same at the probe's co-run slowdowns alone (`*_probe_only`), and with the CPU probe
`predicted_no_sharing_jct_s` (engines on cores of their own); the rows' rule: dualpath/bench/repredict.py.
"""
from __future__ import annotations

DEFAULT_DATA_PLANE = 1.0e9  # bytes/s when the run measured none (shm copies on one host reach several GB/s)


def thresholds(settings: list[tuple[str, str, str]]) -> tuple[int, int]:
    """The scheduler's (alpha, beta) in tokens: its defaults, or what `--set` gave."""
    from services.scheduler.config import SchedulerConfig

    alpha, beta = SchedulerConfig.pe_alpha_tokens, SchedulerConfig.pe_beta_tokens
    for service, key, value in settings:
        if service == "scheduler" and key == "pe-alpha-tokens":
            alpha = int(value)
        elif service == "scheduler" and key == "pe-beta-tokens":
            beta = int(value)
    return alpha, beta


def data_plane_bytes_s(doc: dict) -> float:
    """The data plane's bandwidth `--data-plane` measured (shm, scattered destinations), else the default."""
    tput = (doc.get("data_plane") or {}).get("throughput") or {}
    return tput.get("shm_scattered_gb_s", DEFAULT_DATA_PLANE / 1e9) * 1e9


def rates(doc: dict, cap, mesh: dict, settings: list, snic_gbit: float):
    """MeshRates for this run, or None when a figure the model needs is missing."""
    from dualpath.sim.calibrate import MeshRates

    probe = getattr(cap, "rates", None)
    cfg = doc["config"]
    block = cfg.get("block_size") or 0
    bpb = cfg.get("kv_bytes_per_block")
    if not probe or not block or not bpb:
        return None
    decode = [e for e in mesh.get("engines", []) if e.get("role") == "decode" and e.get("total_blocks")]
    kv_tokens = min(e["total_blocks"] for e in decode) * block if decode else 1 << 30
    alpha, beta = thresholds(settings)
    return MeshRates(
        prefill_tok_s=probe["prefill_tok_s"], turn_overhead_s=probe["turn_overhead_s"],
        decode_step_s=probe["decode_step_s"], decode_per_seq_s=probe["decode_per_seq_s"],
        snic_bytes_s=snic_gbit * 1e9 / 8 if snic_gbit else None,
        data_plane_bytes_s=data_plane_bytes_s(doc),
        kv_bytes_per_token=bpb / block, block_tokens=block, prefill_nodes=cap.prefill_nodes,
        decode_nodes=cap.decode_nodes, kv_tokens_per_engine=kv_tokens, alpha_tokens=alpha, beta_tokens=beta,
        decode_per_ctx_s=probe.get("decode_per_ctx_s", 0.0), decode_probe_ctx=probe.get("decode_probe_ctx", 0),
        kv_cpu_s_per_byte=probe.get("kv_cpu_s_per_byte", 0.0),
        host_cores=cap.cores if "background_cores" in probe else 0, background_cores=probe.get("background_cores", 0.0),
        corun_prefill_slow=probe.get("corun_prefill_slow", 1.0), corun_decode_slow=probe.get("corun_decode_slow", 1.0))


def add_predictions(doc: dict, cap, mesh: dict, settings: list, snic_gbit: float,
                    lengths: dict[str, list[list[tuple[int, int]]]]) -> None:
    """Predicted JCT beside measured on every offline row (None where it cannot be predicted); a row of
    repeat k takes the probe's co-run slowdowns raised to what the OTHER repeats' oracle runs measured."""
    from dualpath.bench.repredict import predict_rows

    if not any(r["kind"] == "offline" for r in doc["runs"]):
        return
    r = rates(doc, cap, mesh, settings, snic_gbit)
    doc["prediction"] = {"rates": vars(r) if r else None,  # at the probe's slowdowns; each repeat's: corun_by_repeat
                         "probe": dict(getattr(cap, "rates", None) or {}),
                         "turns": lengths}  # each mode's replayed (append, gen) turns: the prediction can be rerun
    predict_rows(doc, r, lengths)
