"""The scheduler's queues and engine assignment, driving the pure policy (`policy/`).

State: one global FIFO of requests waiting for a prefill engine; a global DE pool; one
private queue per decode-engine group. Every dispatch tick emulates a synchronous pull
of every engine group (docs/design.md#engine-groups-and-pulls): PE groups take from the FIFO by Algorithm 1
(`assign_prefill`); requests holding a PE enter the DE pool, which goes to the DE group
with the smallest total tokens (`pick_de_group`); each DE group then places its private
queue by the two-level rule (`assign_decode`). A request is dispatched once it has both.
Pure: values in, decisions out.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from services.scheduler.policy import (EngineReport, PeThresholds, Request, assign_decode, assign_prefill,
                                       pick_de_group)


@dataclass(frozen=True)
class Job:
    req_id: str
    prompt_tokens: int
    max_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens


@dataclass
class EngineLoad:
    """One engine as the dispatcher sees it at a pull (ids are the mesh's strings)."""

    engine: str
    tok: int = 0  # tok_e: tokens of requests assigned and not finished
    seq: int = 0  # seq_e
    capacity_tokens: int = 0  # KV memory size in tokens (DE)
    group: str = ""  # engine group (all engines of a node share one)
    node: str = ""
    read_q: int = 0  # storage read queue of the engine's node, tokens

    @property
    def free_tokens(self) -> int:
        return max(0, self.capacity_tokens - self.tok)


@dataclass(frozen=True)
class Assignment:
    req_id: str
    pe: str
    de: str


@dataclass
class Dispatcher:
    thresholds: PeThresholds = field(default_factory=lambda: PeThresholds(alpha=1 << 30, beta=1 << 30))
    queue: deque[Job] = field(default_factory=deque)  # waiting for a PE (FIFO)
    de_pool: list[Job] = field(default_factory=list)  # hold a PE, not yet given to a DE group
    de_private: dict[str, deque[Job]] = field(default_factory=dict)  # DE group -> its queue
    pe_of: dict[str, str] = field(default_factory=dict)  # req_id -> PE engine (waiting for a DE)
    _ids: dict[str, int] = field(default_factory=dict)
    _next_id: int = 0
    _turn: int = 0  # rotates which PE group pulls first (pulls are staggered in time in a real mesh)

    def enqueue(self, job: Job) -> None:
        self.queue.append(job)

    def waiting(self) -> int:
        return len(self.queue) + len(self.de_pool) + sum(len(q) for q in self.de_private.values())

    def remove(self, req_id: str) -> bool:
        """Drop a request wherever it waits (cancelled); True if it was waiting."""
        found = False
        for q in [self.queue, *self.de_private.values()]:
            for job in [j for j in q if j.req_id == req_id]:
                q.remove(job)
                found = True
        before = len(self.de_pool)
        self.de_pool = [j for j in self.de_pool if j.req_id != req_id]
        self.pe_of.pop(req_id, None)
        self._ids.pop(req_id, None)
        return found or len(self.de_pool) != before

    def assign(self, pes: list[EngineLoad], des: list[EngineLoad]) -> list[Assignment]:
        """One pull of every group; loads are updated in place as requests are placed."""
        self._pull_prefill(pes)
        return self._pull_decode(des)

    # prefill side ----------------------------------------------------------------------
    def _pull_prefill(self, pes: list[EngineLoad]) -> None:
        by_id = {e.engine: e for e in pes}
        groups = _groups(pes)
        self._turn += 1
        k = self._turn % len(groups) if groups else 0
        for group in groups[k:] + groups[:k]:
            if not self.queue:
                break
            reports = [EngineReport(self._id(e.engine), self._id(e.node), e.seq, e.tok, e.read_q) for e in group]
            jobs = {self._id(j.req_id): j for j in self.queue}
            policy_q = deque(Request(self._id(j.req_id), j.prompt_tokens) for j in self.queue)
            placed = assign_prefill(policy_q, reports, self.thresholds)
            names = {self._id(e.engine): e.engine for e in group}
            for a in placed:
                job, pe = jobs[a.rid], by_id[names[a.engine]]
                pe.tok += job.prompt_tokens
                pe.seq += 1
                self.pe_of[job.req_id] = pe.engine
                self.de_pool.append(job)
            taken = {jobs[a.rid].req_id for a in placed}
            self.queue = deque(j for j in self.queue if j.req_id not in taken)

    # decode side -----------------------------------------------------------------------
    def _pull_decode(self, des: list[EngineLoad]) -> list[Assignment]:
        groups = _groups(des)
        if not groups:
            return []
        if self.de_pool:  # level 1: the whole pool to the group with the fewest tokens
            totals = {i: sum(e.tok for e in g) for i, g in enumerate(groups)}
            target = groups[pick_de_group(totals)][0].group
            self.de_private.setdefault(target, deque()).extend(self.de_pool)
            self.de_pool = []
        out: list[Assignment] = []
        for group in groups:  # level 2 inside each group
            private = self.de_private.get(group[0].group)
            if not private:
                continue
            jobs = {self._id(j.req_id): j for j in private}
            reports = [EngineReport(self._id(e.engine), self._id(e.node), e.seq, e.tok, 0, e.free_tokens)
                       for e in group]
            policy_q = deque(Request(self._id(j.req_id), j.tokens, j.tokens) for j in private)
            placed = assign_decode(policy_q, reports)
            names = {self._id(e.engine): e for e in group}
            for a in placed:
                job, de = jobs[a.rid], names[a.engine]
                de.tok += job.tokens
                de.seq += 1
                out.append(Assignment(job.req_id, self.pe_of.pop(job.req_id), de.engine))
            taken = {jobs[a.rid].req_id for a in placed}
            self.de_private[group[0].group] = deque(j for j in private if j.req_id not in taken)
        for a in out:
            self._ids.pop(a.req_id, None)
        return out

    def _id(self, name: str) -> int:
        """Stable small ints for the policy's value types (it never sees our string ids)."""
        got = self._ids.get(name)
        if got is None:
            self._next_id += 1
            got = self._ids[name] = self._next_id
        return got


def _groups(engines: list[EngineLoad]) -> list[list[EngineLoad]]:
    """Engines grouped by `group` (leader first: lowest engine id), groups in name order."""
    out: dict[str, list[EngineLoad]] = {}
    for e in sorted(engines, key=lambda e: (e.group, e.engine)):
        out.setdefault(e.group or e.engine, []).append(e)
    return [out[g] for g in sorted(out)]
