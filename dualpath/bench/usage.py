"""What one bench run used, read from the mesh's own counters: the terms of its lower bound.

`snapshot(mesh)` reads every announced process's counters at one moment; `used(a, b)` is what
happened between two snapshots. Owns the parsing; knows nothing about bounds.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import httpx

from dualpath.bench import procstat

_LINE = re.compile(r"^(dualpath_\w+)(\{[^}]*\})?\s+([0-9.eE+-]+)$", re.M)
DATA_PLANE_KINDS = ("pd_push", "de_path_pull")  # bytes that cross between engines (h2d: local copies)


@dataclass
class Usage:
    read_bytes: dict[str, float] = field(default_factory=dict)  # node -> storage bytes read
    written_bytes: dict[str, float] = field(default_factory=dict)  # node -> storage bytes written
    prefill_s: dict[str, float] = field(default_factory=dict)  # prefill engine -> compute seconds
    decode_s: dict[str, float] = field(default_factory=dict)  # decode engine -> step seconds
    data_plane_bytes: float = 0.0
    cpu_s: float | None = None  # CPU seconds of every mesh process on this host (None: not local)
    engine_cpu_s: dict[str, float] = field(default_factory=dict)  # engine -> its process's CPU seconds (local)

    def minus(self, before: "Usage") -> "Usage":
        def d(a: dict, b: dict) -> dict:
            return {k: v - b.get(k, 0.0) for k, v in a.items()}
        cpu = None if self.cpu_s is None or before.cpu_s is None else self.cpu_s - before.cpu_s
        return Usage(d(self.read_bytes, before.read_bytes), d(self.written_bytes, before.written_bytes),
                     d(self.prefill_s, before.prefill_s), d(self.decode_s, before.decode_s),
                     self.data_plane_bytes - before.data_plane_bytes, cpu,
                     {k: v - before.engine_cpu_s[k] for k, v in self.engine_cpu_s.items() if k in before.engine_cpu_s})


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text -> (name, labels, value) of every dualpath_* sample."""
    out = []
    for name, labels, value in _LINE.findall(text):
        out.append((name, dict(re.findall(r'(\w+)="([^"]*)"', labels or "")), float(value)))
    return out


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process on this host (None when it is not here)."""
    return procstat.cpu_seconds(pid) if os.path.exists(f"/proc/{pid}/stat") else None


def snapshot(client: httpx.Client, url: str, extra_pids: tuple[int, ...] = ()) -> Usage:
    mesh = client.get(url + "/v1/mesh", timeout=10).json()
    u = Usage(cpu_s=0.0)
    rows = [r for kind in ("engines", "traffic_managers", "gateways", "schedulers") for r in mesh.get(kind, [])]
    for row in rows:
        if row.get("metrics_url"):
            try:
                samples = parse(client.get(row["metrics_url"], timeout=5).text)
            except httpx.HTTPError:
                continue
            _take(u, row, samples)
    for row in mesh.get("engines", []):
        c = cpu_seconds(row["pid"]) if row.get("pid") else None
        if c is not None:
            u.engine_cpu_s[row.get("engine") or row["instance"]] = c
    pids = {r.get("pid") for r in rows if r.get("pid")} | set(extra_pids)
    for pid in pids:
        c = cpu_seconds(pid)
        if c is None:
            u.cpu_s = None
            break
        u.cpu_s += c
    return u


def _take(u: Usage, row: dict, samples) -> None:
    for name, labels, value in samples:
        if name == "dualpath_storage_gateway_read_bytes_total":
            u.read_bytes[labels.get("node", row["node"])] = u.read_bytes.get(labels.get("node", row["node"]), 0) + value
        elif name == "dualpath_storage_gateway_write_bytes_total":
            key = labels.get("node", row["node"])
            u.written_bytes[key] = u.written_bytes.get(key, 0.0) + value
        elif name == "dualpath_prefill_engine_compute_seconds_total":
            u.prefill_s[row.get("engine") or row["instance"]] = value
        elif name == "dualpath_decode_engine_step_seconds_sum":
            u.decode_s[row.get("engine") or row["instance"]] = value
        elif name == "dualpath_traffic_manager_bytes_total" and labels.get("kind") in DATA_PLANE_KINDS:
            u.data_plane_bytes += value
