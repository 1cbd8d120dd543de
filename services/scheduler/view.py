"""The scheduler's view of the live mesh, built only from announcements (no static list).

An engine is assignable while it and its traffic-manager have announced within
`timeout_s`, its TM is attached to its KV memory, and neither said it is leaving.
Pure: the caller passes the clock.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from shared.messages.codes import LoadMode
from shared.messages.registry import (Announce, EngineAnnounce, StorageGatewayAnnounce, SchedulerAnnounce,
                                      TrafficManagerAnnounce)


@dataclass
class Seen:
    msg: Announce
    at: float


@dataclass
class MeshView:
    timeout_s: float = 3.0
    engines: dict[str, Seen] = field(default_factory=dict)  # engine id -> last announce
    tms: dict[str, Seen] = field(default_factory=dict)  # engine id -> its TM's last announce
    gateways: dict[str, Seen] = field(default_factory=dict)  # node -> gateway
    schedulers: dict[str, Seen] = field(default_factory=dict)

    def update(self, msg: Announce, now: float) -> None:
        table, key = self._slot(msg)
        if table is None:
            return
        if msg.leaving:
            table.pop(key, None)
        else:
            table[key] = Seen(msg, now)

    def _slot(self, msg: Announce):
        if isinstance(msg, EngineAnnounce):
            return self.engines, msg.engine
        if isinstance(msg, TrafficManagerAnnounce):
            return self.tms, msg.engine
        if isinstance(msg, StorageGatewayAnnounce):
            return self.gateways, msg.node
        if isinstance(msg, SchedulerAnnounce):
            return self.schedulers, msg.instance
        return None, ""

    def alive(self, seen: Seen | None, now: float) -> bool:
        return seen is not None and now - seen.at <= self.timeout_s

    def assignable(self, role: str, now: float) -> list[EngineAnnounce]:
        out = []
        for eid, seen in self.engines.items():
            eng: EngineAnnounce = seen.msg
            tm = self.tms.get(eid)
            if eng.role == role and self.alive(seen, now) and self.alive(tm, now) and tm.msg.ready and eng.kv:
                out.append(eng)
        return sorted(out, key=lambda e: e.engine)

    def dead_engines(self, now: float) -> list[str]:
        """Engines (or their TMs) that stopped heartbeating; the caller fails their requests."""
        dead = [eid for eid, seen in self.engines.items() if not self.alive(seen, now)]
        dead += [eid for eid, seen in self.tms.items() if not self.alive(seen, now) and eid in self.engines]
        return sorted(set(dead))

    def forget(self, engine: str) -> None:
        self.engines.pop(engine, None)
        self.tms.pop(engine, None)

    def model_ids(self) -> list[str]:
        return sorted({s.msg.model_id for s in self.engines.values() if s.msg.model_id})

    def max_context(self) -> int:
        ctx = [s.msg.max_context for s in self.engines.values() if s.msg.max_context]
        return min(ctx) if ctx else 0

    def store_layout(self):
        """The store layout the engines announce (all engines of a mesh serve one model)."""
        for seen in self.engines.values():
            if seen.msg.store is not None:
                return seen.msg.store
        return None

    def node_of(self, engine: str) -> str:
        seen = self.engines.get(engine)
        return seen.msg.node if seen else ""

    def health(self, now: float, queued: int, running: int) -> tuple[bool, dict]:
        """(serving: at least one assignable engine of each role, the /health body)."""
        pes, des = self.assignable("prefill", now), self.assignable("decode", now)
        ok = bool(pes and des)
        return ok, {"status": "ok" if ok else "degraded", "prefill_engines": len(pes), "decode_engines": len(des),
                    "queued": queued, "running": running}

    def snapshot(self, now: float, mode: LoadMode) -> dict:
        """JSON-ready view: every live process, its role, node and metrics URL (for tools)."""
        def rows(table: dict) -> list[dict]:
            out = []
            for seen in table.values():
                m = seen.msg
                row = {"kind": type(m).__name__.replace("Announce", "").lower(), "instance": m.instance,
                       "node": m.node, "metrics_url": m.metrics_url, "age_s": round(now - seen.at, 3),
                       "alive": self.alive(seen, now), "pid": m.pid}
                for field in ("engine", "role", "seq", "tok", "free_blocks", "total_blocks", "read_q_blocks",
                              "read_q_bytes", "buffer_bytes", "buffer_free_bytes", "ready"):
                    if hasattr(m, field):
                        row[field] = getattr(m, field)
                out.append(row)
            return out

        layout = self.store_layout()
        return {"mode": mode, "engines": rows(self.engines), "traffic_managers": rows(self.tms),
                "gateways": rows(self.gateways), "schedulers": rows(self.schedulers),
                "max_context": self.max_context(), "block_size": layout.block_size if layout else 0}
