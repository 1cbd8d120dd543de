"""The scheduler's view of the live mesh, built only from announcements (no static list).

An engine is assignable while it and its TM announce, its TM is attached and neither is leaving.
A heartbeat that changes nothing costs a dispatch round nothing. Pure: the caller passes the clock."""
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
    suspects: dict[str, float] = field(default_factory=dict)  # engine -> when an attempt on it failed
    restarted: list[str] = field(default_factory=list)  # engines whose engine or TM came back as a new process
    version: int = 0  # bumped whenever which engines are assignable, or their lines, may change
    _cache: dict[str, tuple[int, float, list[EngineAnnounce]]] = field(default_factory=dict)

    def update(self, msg: Announce, now: float) -> bool:
        """Note an announcement; True when it may change what is assignable (a dispatch round is due)."""
        table, key = self._slot(msg)
        if table is None:
            return False
        if msg.leaving:
            gone = table.pop(key, None) is not None
            if gone and table is not self.gateways and table is not self.schedulers:
                self.version += 1
            return gone
        seen = table.get(key)
        if seen is None:
            table[key] = Seen(msg, now)
            changed = True
        else:
            if seen.msg.instance != msg.instance and table is not self.gateways and table is not self.schedulers:
                self.restarted.append(key)  # a new process under the same engine id: the old one's work is lost
            changed = now - seen.at > self.timeout_s or _lines(seen.msg) != _lines(msg)  # back, or changed
            seen.msg, seen.at = msg, now
        changed = changed and table is not self.gateways and table is not self.schedulers
        if key in self.suspects and table is not self.gateways and self._heard_since(key, self.suspects[key]):
            del self.suspects[key]  # both its processes spoke after the failure: it serves again
            changed = True
        if changed:
            self.version += 1
        return changed

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

    def suspect(self, engines: list[str], now: float) -> None:
        """None of `engines` is assigned again until its engine and its TM both announced after `now`."""
        for e in engines:
            if e:
                self.suspects[e] = now
        self.version += 1

    def _heard_since(self, engine: str, t: float) -> bool:
        e, tm = self.engines.get(engine), self.tms.get(engine)
        return e is not None and tm is not None and e.at > t and tm.at > t

    def take_restarted(self) -> list[str]:
        """The engines seen restarting since the last call, each once."""
        out, self.restarted = list(dict.fromkeys(self.restarted)), []
        return out

    def alive(self, seen: Seen | None, now: float) -> bool:
        return seen is not None and now - seen.at <= self.timeout_s

    def assignable(self, role: str, now: float) -> list[EngineAnnounce]:
        """Live, ready engines of `role` by id; the same list object while nothing changed (do not mutate)."""
        got = self._cache.get(role)
        if got is not None and got[0] == self.version and now <= got[1]:
            return got[2]
        out, expires = [], float("inf")
        for eid, seen in self.engines.items():
            eng: EngineAnnounce = seen.msg
            tm = self.tms.get(eid)
            if eng.role == role and eid not in self.suspects and self.alive(seen, now) and self.alive(tm, now) and tm.msg.ready and eng.kv:
                out.append(eng)
                expires = min(expires, seen.at + self.timeout_s, tm.at + self.timeout_s)
        out.sort(key=lambda e: e.engine)
        if got is not None and got[0] == self.version and list(map(_engine, got[2])) == list(map(_engine, out)):
            got[2][:] = out  # an expiry check that found everyone still heartbeating: keep the list object
            out = got[2]  # (same version: every line reads the same), so the caller's lines stay too
        self._cache[role] = (self.version, expires, out)
        return out

    def dead_engines(self, now: float) -> list[str]:
        return sorted(self.silences(now))

    def silences(self, now: float) -> dict[str, float]:
        """Engine -> seconds since it or its TM last announced, for those silent past `timeout_s`."""
        out = {eid: now - seen.at for eid, seen in self.engines.items() if not self.alive(seen, now)}
        for eid, seen in self.tms.items():
            if eid in self.engines and not self.alive(seen, now):
                out[eid] = max(out.get(eid, 0.0), now - seen.at)
        return out

    def forget(self, engine: str) -> None:
        self.engines.pop(engine, None)
        self.tms.pop(engine, None)
        self.version += 1

    def model_ids(self) -> list[str]:
        return sorted({s.msg.model_id for s in self.engines.values() if s.msg.model_id})

    def max_context(self) -> int:
        ctx = [s.msg.max_context for s in self.engines.values() if s.msg.max_context]
        return min(ctx) if ctx else 0

    def store_layout(self):
        for seen in self.engines.values():
            if seen.msg.store is not None:
                return seen.msg.store
        return None

    def node_of(self, engine: str) -> str:
        seen = self.engines.get(engine)
        return seen.msg.node if seen else ""

    def maps_buffer(self, engine: str, holder: str) -> bool:
        """`engine` may map `holder`'s TM buffer directly: its own, or one sharing memory on its host."""
        if engine == holder:
            return True
        a, b = self.tms.get(engine), self.tms.get(holder)
        return a is not None and b is not None and bool(a.msg.shm_host) and a.msg.shm_host == b.msg.shm_host

    def health(self, now: float, queued: int, running: int) -> tuple[bool, dict]:
        """(at least one assignable engine of each role, the /health body)."""
        pes, des = self.assignable("prefill", now), self.assignable("decode", now)
        ok = bool(pes and des)
        return ok, {"status": "ok" if ok else "degraded", "prefill_engines": len(pes), "decode_engines": len(des),
                    "queued": queued, "running": running}

    def snapshot(self, now: float, mode: LoadMode) -> dict:
        def rows(table: dict) -> list[dict]:
            out = []
            for seen in table.values():
                m = seen.msg
                row = {"kind": type(m).__name__.replace("Announce", "").lower(), "instance": m.instance,
                       "node": m.node, "metrics_url": m.metrics_url, "age_s": round(now - seen.at, 3),
                       "alive": self.alive(seen, now), "pid": m.pid}
                for field in ("engine", "role", "seq", "tok", "free_blocks", "total_blocks", "read_q_blocks",
                              "read_q_bytes", "buffer_bytes", "buffer_free_bytes", "ready", "prefetch_bytes",
                              "prefetch_room_bytes"):
                    if hasattr(m, field):
                        row[field] = getattr(m, field)
                if getattr(m, "kv", None) is not None:
                    row["kv_block_bytes"] = m.kv.block_nbytes
                out.append(row)
            return out

        layout = self.store_layout()
        return {"mode": mode, "engines": rows(self.engines), "traffic_managers": rows(self.tms),
                "gateways": rows(self.gateways), "schedulers": rows(self.schedulers),
                "max_context": self.max_context(), "block_size": layout.block_size if layout else 0}


def _engine(msg: EngineAnnounce) -> str:
    return msg.engine


def _lines(msg: Announce) -> tuple:
    """What a dispatch round takes from an announcement (loads come from the ledger)."""
    if isinstance(msg, EngineAnnounce):
        return msg.role, msg.group, msg.node, msg.total_blocks, msg.kv.block_size if msg.kv else None
    if isinstance(msg, TrafficManagerAnnounce):
        return (msg.ready,)
    return ()
