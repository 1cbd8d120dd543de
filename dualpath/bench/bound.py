"""The physical lower bound on an offline run's JCT, printed beside the measured JCT.

    bound = max(hit KV bytes / summed read bandwidth of the nodes allowed to read,
                prefill compute (miss tokens) / summed prefill rate,
                the longest serial chain of one job: sum over its turns of
                miss / one engine's prefill rate + (gen - 1) x the best time per output token)

Nodes allowed to read: basic -> the prefill nodes (PE path only); dualpath -> every
node; oracle -> none (no I/O: the storage term is 0). A term whose rate is unknown
(uncapped storage, no probe) is left out and reported as None. Pure arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass

from shared.messages.codes import LoadMode


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the mesh can do: per-node storage read rate and per-engine compute rates."""

    read_bytes_per_s: float | None  # per node (None = uncapped / unknown)
    prefill_nodes: int
    decode_nodes: int
    prefill_engines: int
    prefill_tps: float | None  # prefill tokens per second of one engine
    tpot_s: float | None  # best decode seconds per token (batch 1)
    rates: dict | None = None  # the probe's separated rates (replay.probe_rates), for the simulator's prediction


def reading_nodes(mode: LoadMode, cap: Capacity) -> int:
    if not LoadMode(mode).moves_kv:
        return 0
    return cap.prefill_nodes + cap.decode_nodes if LoadMode(mode).both_paths else cap.prefill_nodes


def lower_bound(mode: LoadMode, hit_bytes: float, miss_tokens: int, chains: list[list[tuple[int, int]]],
                cap: Capacity) -> dict:
    """Terms and the bound (seconds); `chains` is per job a list of (miss tokens, gen) per turn."""
    nodes = reading_nodes(mode, cap)
    storage = 0.0 if nodes == 0 else (hit_bytes / (nodes * cap.read_bytes_per_s) if cap.read_bytes_per_s else None)
    compute = miss_tokens / (cap.prefill_engines * cap.prefill_tps) if cap.prefill_tps else None
    serial = None
    if cap.prefill_tps and cap.tpot_s is not None:
        serial = max((sum(m / cap.prefill_tps + (g - 1) * cap.tpot_s for m, g in c) for c in chains), default=0.0)
    terms = {"storage_s": storage, "compute_s": compute, "serial_s": serial}
    known = [v for v in terms.values() if v is not None]
    return {**terms, "bound_s": max(known) if known else None, "reading_nodes": nodes,
            "limit": max((k for k, v in terms.items() if v is not None), key=lambda k: terms[k], default=None)}
