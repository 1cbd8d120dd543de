"""The global request queue and engine assignment (pure: values in, decisions out).

Requests wait in one FIFO queue. Assignment takes requests from the head and places
each on the prefill engine with the fewest outstanding tokens (tok_e) and the decode
engine with the fewest outstanding tokens among those whose KV memory can hold the
request; the head blocks the queue when no engine can take it (FIFO on the PE side).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


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
    engine: str
    tok: int = 0  # outstanding tokens assigned by this scheduler
    seq: int = 0
    capacity_tokens: int = 0  # KV memory size in tokens (free + used)


@dataclass(frozen=True)
class Assignment:
    req_id: str
    pe: str
    de: str


@dataclass
class Dispatcher:
    queue: deque[Job] = field(default_factory=deque)

    def enqueue(self, job: Job) -> None:
        self.queue.append(job)

    def remove(self, req_id: str) -> bool:
        for job in self.queue:
            if job.req_id == req_id:
                self.queue.remove(job)
                return True
        return False

    def assign(self, pes: list[EngineLoad], des: list[EngineLoad]) -> list[Assignment]:
        """Assign from the head while engines exist; loads are updated in place."""
        out: list[Assignment] = []
        while self.queue and pes and des:
            job = self.queue[0]
            fits = [d for d in des if d.capacity_tokens - d.tok >= job.tokens] or \
                   [d for d in des if d.capacity_tokens >= job.tokens and d.seq == 0]
            if not fits:
                break
            pe = min(pes, key=lambda e: (e.tok, e.seq, e.engine))
            de = min(fits, key=lambda e: (e.tok, e.seq, e.engine))
            self.queue.popleft()
            for eng in (pe, de):
                eng.tok += job.tokens
                eng.seq += 1
            out.append(Assignment(job.req_id, pe.engine, de.engine))
        return out
