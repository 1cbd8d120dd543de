"""The physical lower bound on an offline run's JCT: one term per resource the run needs.

Terms: storage read and write, prefill and decode compute, engine cores, host CPU, data plane,
and the longest agent's serial chain. Compute terms come from the run itself; a term whose
inputs are unknown is None and left out. Pure arithmetic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from dualpath.bench.usage import Usage
from shared.messages.codes import LoadMode


@dataclass(frozen=True, slots=True)
class MeshCapacity:
    """What the mesh can do: per-node storage rates, engine counts and compute rates, cores."""

    read_bytes_per_s: float | None  # per node (None = uncapped / unknown)
    prefill_nodes: int
    decode_nodes: int
    prefill_engines: int
    prefill_tps: float | None  # prefill tokens per second of one engine (best, alone)
    tpot_s: float | None  # best decode seconds per token (batch 1)
    write_bytes_per_s: float | None = None  # per node
    cores: int = 0  # cores this host gives the mesh (0: unknown)
    data_plane_bytes_per_s: float | None = None
    rates: dict | None = None  # the probe's separated rates (replay.probe_rates), for the simulator's prediction


class ChainTurn(NamedTuple):
    """One turn of an agent's chain: what it computed and read, and (when known) what it took."""

    miss: int  # prompt tokens computed
    gen: int  # tokens generated
    hit_bytes: float  # stored KV it read
    first_s: float = math.inf  # arrival -> first token, as measured
    rest_s: float = math.inf  # first token -> last, as measured


def reading_nodes(mode: LoadMode, cap: MeshCapacity) -> int:
    if not LoadMode(mode).moves_kv:
        return 0
    return cap.prefill_nodes + cap.decode_nodes if LoadMode(mode).both_paths else cap.prefill_nodes


def _per_node(values: dict[str, float], rate: float | None) -> float | None:
    if not values:
        return 0.0
    return max(values.values()) / rate if rate else None


def lower_bound(mode: LoadMode, used: Usage, chains: list[list[ChainTurn]], cap: MeshCapacity) -> dict:
    """Terms and the bound (seconds); `chains` is per job its turns in order (tuples in ChainTurn's order)."""
    mode = LoadMode(mode)
    nodes = reading_nodes(mode, cap)
    read = sum(used.read_bytes.values())
    terms = {
        "storage_read_s": 0.0 if nodes == 0 else (read / (nodes * cap.read_bytes_per_s)
                                                  if cap.read_bytes_per_s else None),
        "storage_write_s": _per_node(used.written_bytes, cap.write_bytes_per_s),
        "prefill_s": max(used.prefill_s.values(), default=None),
        "decode_s": max(used.decode_s.values(), default=None),
        "engines_cores_s": None, "cpu_s": None,
        "data_plane_s": (used.data_plane_bytes / cap.data_plane_bytes_per_s) if cap.data_plane_bytes_per_s else None,
        "serial_s": _serial(mode, chains, cap),
    }
    engines = len(used.prefill_s) + len(used.decode_s)
    if cap.cores and engines:
        cpu = used.engine_cpu_s
        busy = [min(s, cpu.get(e, s)) for part in (used.prefill_s, used.decode_s) for e, s in part.items()]
        terms["engines_cores_s"] = sum(busy) / min(cap.cores, engines)
    if cap.cores and used.cpu_s is not None:
        terms["cpu_s"] = used.cpu_s / cap.cores
    known = {k: v for k, v in terms.items() if v is not None}
    limit = max(known, key=known.get) if known else None
    return {**terms, "bound_s": known[limit] if limit else None, "reading_nodes": nodes, "limit": limit}


def _serial(mode: LoadMode, chains, cap: MeshCapacity) -> float | None:
    if not cap.prefill_tps or cap.tpot_s is None:
        return None
    paths = 0 if not mode.moves_kv else (2 if mode == LoadMode.DUALPATH_SPLIT else 1)
    rate = (cap.read_bytes_per_s or 0.0) * paths

    def turn(t: ChainTurn) -> float:
        own_read = t.hit_bytes / rate if rate and paths else 0.0
        return min(max(own_read, t.miss / cap.prefill_tps), t.first_s) + min((t.gen - 1) * cap.tpot_s, t.rest_s)

    return max((sum(turn(ChainTurn(*t)) for t in c) for c in chains), default=0.0)
