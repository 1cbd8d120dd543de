"""The scheduling queues and engine assignment, driving the pure policy (`policy/`)."""
from __future__ import annotations

import operator
from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

import msgspec

from shared.sched.ledger import Ledger
from shared.sched.policy import (EngineReport, PeThresholds, Request, assign_decode, assign_prefill,
                                       pick_de_group)


ROSTERS = 256  # rosters (engine lines grouped) kept at most; callers passing fresh lines reuse none


class Job(msgspec.Struct, frozen=True):
    req_id: Hashable
    prompt_tokens: int
    max_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens


@dataclass
class EngineLoad:
    engine: Hashable
    tok: int = 0  # tok_e: tokens of requests assigned and not finished
    seq: int = 0  # seq_e
    capacity_tokens: int = 0  # KV memory size in tokens (DE)
    group: Hashable = ""  # engine group (all engines of a node share one)
    node: Hashable = ""
    read_q: int = 0  # storage read queue of the engine's node, tokens

    @property
    def free_tokens(self) -> int:
        return max(0, self.capacity_tokens - self.tok)


class Assignment(msgspec.Struct, frozen=True):
    req_id: Hashable
    pe: Hashable
    de: Hashable


@dataclass
class Dispatcher:
    thresholds: PeThresholds = field(default_factory=lambda: PeThresholds(alpha=1 << 30, beta=1 << 30))
    queue: deque[Request] = field(default_factory=deque)  # waiting for a PE (FIFO), prompt tokens
    de_pool: list[Request] = field(default_factory=list)  # hold a PE, not yet given to a DE group
    de_private: dict[Hashable, deque[Request]] = field(default_factory=dict)  # DE group -> its queue
    pe_of: dict[Hashable, Hashable] = field(default_factory=dict)  # req_id -> PE engine (waiting for a DE)
    ledger: Ledger = field(default_factory=Ledger)  # tok_e / seq_e of every engine, kept as requests move
    jobs: dict[int, Job] = field(default_factory=dict)  # policy id -> job, for every waiting request
    _rid: dict[Hashable, int] = field(default_factory=dict)  # req_id -> policy id (while waiting)
    _eid: dict[Hashable, int] = field(default_factory=dict)  # engine / node -> policy id
    _rosters: dict[tuple, "_Roster"] = field(default_factory=dict)  # (role, first line) -> lines last seen
    _de_idle: dict[Hashable, tuple] = field(default_factory=dict)  # DE group -> its loads when its last
    # level-2 pull placed nothing (same queue + same loads = same outcome: the pull is skipped)
    _next: int = 0
    _turn: int = 0  # rotates which PE group pulls first (pulls are staggered in time in a real mesh)

    def enqueue(self, job: Job) -> None:
        rid = self._new_id()
        self._rid[job.req_id] = rid
        self.jobs[rid] = job
        self.queue.append(Request(rid, job.prompt_tokens))

    def waiting(self) -> int:
        return len(self.jobs)

    def prefill_done(self, req_id: Hashable) -> None:
        self.ledger.prefill_done(req_id)

    def remove(self, req_id: Hashable) -> bool:
        """Forget a request wherever it is (queues and engine loads); True if it was waiting."""
        self.ledger.release(req_id)
        self.pe_of.pop(req_id, None)
        rid = self._rid.pop(req_id, None)
        if rid is None:
            return False
        del self.jobs[rid]
        _drop(self.queue, rid)
        for key, q in self.de_private.items():
            if _drop(q, rid):
                self._de_idle.pop(key, None)
        self.de_pool = [r for r in self.de_pool if r.rid != rid]
        return True

    def assign(self, pes: list[EngineLoad], des: list[EngineLoad],
               changed: Iterable[Hashable] | None = None) -> list[Assignment]:
        self.pull_prefill(pes)
        return self.pull_decode(des, changed)

    # prefill side ----------------------------------------------------------------------
    def pull_prefill(self, pes: list[EngineLoad]) -> int:
        """The prefill groups of `pes` pull, in rotating order; returns how many requests got a PE."""
        roster = self._roster("prefill", pes)
        n, beta = len(roster.groups), self.thresholds.beta
        placed = 0
        self._turn += 1
        for i in range(n):
            if not self.queue:
                break
            g = (self._turn + i) % n
            group = roster.groups[g]
            if all(e.tok > beta for e in group):
                continue  # every engine is overloaded (class 1): the pull places nothing
            reports = [EngineReport(eid, nid, e.seq, e.tok, e.read_q) for e, (eid, nid) in zip(group, roster.ids[g])]
            for a in assign_prefill(self.queue, reports, self.thresholds):  # pops what it places
                job, pe = self.jobs[a.rid], roster.by_id[a.engine]
                pe.tok += job.prompt_tokens
                pe.seq += 1
                self.pe_of[job.req_id] = pe.engine
                self.ledger.charge_pe(job.req_id, pe.engine, job.prompt_tokens)
                self.de_pool.append(Request(a.rid, job.tokens, job.tokens))
                placed += 1
        return placed

    # decode side -----------------------------------------------------------------------
    def pull_decode(self, des: list[EngineLoad], changed: Iterable[Hashable] | None = None) -> list[Assignment]:
        """The DE pool to the group with the fewest tokens, then each group places its queue; returns the
        new assignments. `changed`: the engines whose lines changed since the last pull (None: unknown)."""
        roster = self._roster("decode", des)
        groups = roster.groups
        if not groups:
            return []
        roster.note_changes(changed)
        if self.de_pool:  # level 1: the whole pool to the group with the fewest tokens
            target = _key(groups[pick_de_group(dict(enumerate(roster.tot)))][0])
            self.de_private.setdefault(target, deque()).extend(self.de_pool)
            self._de_idle.pop(target, None)
            self.de_pool = []
        out: list[Assignment] = []
        waiting = sorted(roster.index[k] for k, q in self.de_private.items() if q and k in roster.index)
        same = roster.same
        for g in waiting:  # level 2 inside each group that has requests waiting, in group order
            group = groups[g]
            key = _key(group[0])
            private = self.de_private[key]
            idle = self._de_idle.get(key)
            if idle is not None and (g in same or idle == _loads(group)):
                same.add(g)
                continue  # nothing changed since a pull that placed nothing
            reports = [EngineReport(eid, nid, e.seq, e.tok, 0, e.free_tokens)
                       for e, (eid, nid) in zip(group, roster.ids[g])]
            placed = assign_decode(private, reports)  # removes what it places
            if not placed:  # (then it changed no load either)
                self._de_idle[key] = _loads(group)
                same.add(g)
            else:
                same.discard(g)
            for a in placed:
                job, de = self.jobs.pop(a.rid), roster.by_id[a.engine]
                de.tok += job.tokens
                de.seq += 1
                roster.tot[g] += job.tokens
                del self._rid[job.req_id]
                self.ledger.charge_de(job.req_id, de.engine, job.tokens)
                out.append(Assignment(job.req_id, self.pe_of.pop(job.req_id), de.engine))
        return out

    def _roster(self, role: str, lines: list[EngineLoad]) -> "_Roster":
        key = (role, id(lines[0]) if lines else None)
        got = self._rosters.get(key)
        if got is None or len(got.lines) != len(lines) or not all(map(operator.is_, got.lines, lines)):
            if len(self._rosters) >= ROSTERS:  # a caller that builds fresh lines each round reuses nothing
                self._rosters.clear()
            got = self._rosters[key] = _Roster(list(lines), _groups(lines), self._eng)
        return got

    def _eng(self, name: Hashable) -> int:
        got = self._eid.get(name)
        if got is None:
            got = self._eid[name] = self._new_id()
        return got

    def _new_id(self) -> int:
        self._next += 1
        return self._next


class _Roster:
    def __init__(self, lines: list[EngineLoad], groups: list[list[EngineLoad]], ids) -> None:
        self.lines = lines
        self.groups = groups
        self.ids = [[(ids(e.engine), ids(("node", e.node))) for e in g] for g in groups]
        self.by_id = {eid: e for g, gids in zip(groups, self.ids) for e, (eid, _) in zip(g, gids)}
        self.index = {_key(g[0]): i for i, g in enumerate(groups)}  # group key -> its place
        self.group_of = {e.engine: i for i, g in enumerate(groups) for e in g}  # engine -> its group's place
        self.tot: list[int] = []  # per group: sum of its lines' tok (kept by note_changes and placements)
        self.same: set[int] = set()  # groups whose lines equal their idle snapshot (Dispatcher._de_idle)
        self.kept = False  # tot and same hold from a previous pull

    def note_changes(self, changed: Iterable[Hashable] | None) -> None:
        if changed is None or not self.kept:
            self.tot = [sum([e.tok for e in g]) for g in self.groups]
            self.same.clear()
            self.kept = True
            return
        dirty = {self.group_of[e] for e in changed if e in self.group_of}
        for g in dirty:
            self.tot[g] = sum([e.tok for e in self.groups[g]])
        self.same -= dirty


def _drop(q: deque[Request], rid: int) -> bool:
    for r in q:
        if r.rid == rid:
            q.remove(r)
            return True
    return False


def _loads(group: list[EngineLoad]) -> tuple:
    return tuple([(e.engine, e.tok, e.seq, e.capacity_tokens) for e in group])


def _key(e: EngineLoad) -> Hashable:
    """An engine's group; an engine that names none is a group of its own."""
    return e.engine if e.group in ("", None) else e.group


def _groups(engines: list[EngineLoad]) -> list[list[EngineLoad]]:
    out: dict[Hashable, list[EngineLoad]] = {}
    for e in sorted(engines, key=lambda e: (_key(e), e.engine)):
        out.setdefault(_key(e), []).append(e)
    return [out[g] for g in sorted(out)]  # type: ignore[type-var]  # one caller's ids: all str or all int
