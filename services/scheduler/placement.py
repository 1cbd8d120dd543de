"""One dispatch round's inputs and outputs: engine loads in, prefill work messages out.

`Lines` refreshes only what moved since the last round, so a round costs what changed, not the
fleet's size. Pure but for `send`."""
from __future__ import annotations

from dataclasses import dataclass

import msgspec
from opentelemetry import trace

from services.scheduler.inflight import InFlight
from services.scheduler.view import MeshView
from shared.messages.codes import LoadMode
from shared.messages.endpoints import EP, forward_subject
from shared.messages.front import Forward
from shared.messages.plan import Source, first
from shared.messages.work import PrefillWork
from shared.sched.dispatch import EngineLoad
from shared.sched.ledger import Ledger
from shared.sched.plan import InBuffer, PlanEnds, PlanInput, build, prompt_blocks
from shared.sched.prefetch import common
from shared.sched.reads import PathDecision, PendingReads
from shared.tracing import recording

tracer = trace.get_tracer("scheduler")
DEFAULT_BLOCK = 64  # block size when no engine has announced a store layout yet


def engine_loads(view: MeshView, ledger: Ledger, reads: PendingReads, role: str, now: float) -> list[EngineLoad]:
    """Every assignable engine of `role` with its load from the ledger: O(engines)."""
    load = ledger.pe_load if role == "prefill" else ledger.de_load
    out = []
    for eng in view.assignable(role, now):
        tok, seq = load(eng.engine)
        out.append(EngineLoad(eng.engine, tok=tok, seq=seq, capacity_tokens=eng.total_blocks * eng.kv.block_size,
                              group=eng.group or eng.node, node=eng.node, read_q=reads.pending.get(eng.node, 0)))
    return out


class Lines:
    def __init__(self) -> None:
        self.src: dict[str, list] = {}  # role -> the view's assignable list the lines were built from
        self.lines: dict[str, list[EngineLoad]] = {"prefill": [], "decode": []}
        self.role_of: dict = {}  # engine -> its role (a line's ledger table)
        self.by_engine: dict = {}
        self.by_node: dict = {}  # node -> its lines (both roles: the lines read as `engine_loads` builds them)
        self.rebuilds = 0
        self.changed: set | None = None  # engines whose lines the last `get` refreshed (None: all rebuilt),
        # for the dispatcher's decode pull to keep its group totals (`Dispatcher.pull_decode(changed=)`)

    def get(self, view: MeshView, ledger: Ledger, reads: PendingReads, now: float) -> tuple[list, list]:
        """(prefill lines, decode lines), the same objects as last round unless the engines changed."""
        fresh = any(view.assignable(role, now) is not self.src.get(role) for role in ("prefill", "decode"))
        if fresh:  # rare (an engine joined, left, went silent): both roles afresh
            for role in ("prefill", "decode"):
                self.src[role] = view.assignable(role, now)
                self.lines[role] = engine_loads(view, ledger, reads, role, now)
            self._index()
            ledger.take_touched()
            reads.take_touched()
            self.changed = None
            return self.lines["prefill"], self.lines["decode"]
        self.changed = touched = ledger.take_touched()
        for engine in touched:
            line = self.by_engine.get(engine)
            if line is not None:
                line.tok, line.seq = (ledger.pe_load if self.role_of[engine] == "prefill" else ledger.de_load)(engine)
        for node in reads.take_touched():
            q = reads.pending.get(node, 0)
            for line in self.by_node.get(node, ()):
                line.read_q = q
        return self.lines["prefill"], self.lines["decode"]

    def _index(self) -> None:
        self.rebuilds += 1
        self.by_engine, self.role_of, self.by_node = {}, {}, {}
        for role, lines in self.lines.items():
            for line in lines:
                self.by_engine[line.engine], self.role_of[line.engine] = line, role
                self.by_node.setdefault(line.node, []).append(line)


@dataclass(frozen=True)
class Placed:
    work: PrefillWork
    path: PathDecision
    prefetched: int = 0  # leading hit blocks already in a buffer (prefetched during a tool call)

    def span_attributes(self, rec: InFlight) -> dict:
        p = self.path
        return {"req_id": rec.req_id, "pe": rec.pe, "de": rec.de, "mode": rec.mode,
                "queue_wait_s": rec.assigned_at - rec.arrived, "hit_blocks": rec.hit_blocks,
                "read_path": p.path, "pe_path_blocks": p.pe_blocks, "de_path_blocks": p.de_blocks,
                "pe_read_queue_tokens": p.pe_queue, "de_read_queue_tokens": p.de_queue, "read_path_reason": p.reason,
                "prefetched_blocks": self.prefetched, "read_at_arrival_blocks": p.pe_blocks + p.de_blocks,
                "prefetch_engine": b.engine if (b := first(self.work.plan, Source.BUFFER)) else ""}


def place(rec: InFlight, pe: str, de: str, view: MeshView, reads: PendingReads, reply: str,
          read_path: str = "auto") -> Placed:
    """Decide the request's read path, hold its reads on the nodes' queues, build its work."""
    pe_node, de_node = view.node_of(pe), view.node_of(de)
    layout = view.store_layout()
    bs = layout.block_size if layout else DEFAULT_BLOCK
    hits = max(0, min(rec.hit_blocks, (rec.work_len - 1) // bs))
    usable = hits if LoadMode(rec.mode).moves_kv else 0  # hits read now, or staged already
    staged = rec.staged
    s = min(common(staged.keys, rec.block_keys), usable) if staged is not None else 0  # prefetched: not read now
    path = reads.decide(rec.mode, usable - s, pe_node, de_node, bs, force=read_path)
    reads.hold(rec.req_id, path, pe_node, de_node, bs)
    buffered = InBuffer(s, staged.engine, staged.owner, staged.slots if _copyable(view, pe, staged) else None) \
        if s else None
    plan = build(rec.mode, PlanInput(prompt_blocks(rec.work_len, bs), hits, rec.hit_blocks,
                                     PlanEnds(pe, pe_node, de, de_node), path.pe_blocks, buffered))
    remote = rec.remote_prompt  # a worker's ids and keys: it fills them in (`addressed`)
    work = PrefillWork(rec.wire_id, [] if remote else rec.work_prompt, rec.work_sampling(), de, reply,
                       block_keys=[] if remote else list(rec.block_keys), plan=plan)
    return Placed(work, path, s)


def _copyable(view: MeshView, pe: str, staged) -> bool:
    """The PE copies the staged blocks itself: in its own TM's buffer, or in one on its host."""
    return staged.slots is not None and (staged.engine == pe or not staged.pending and view.maps_buffer(pe, staged.engine))


def addressed(rec: InFlight, pe: str, work: PrefillWork, subjects) -> tuple[str, msgspec.Struct]:
    """(subject, message) taking `work` to `pe`, directly or through the front-door worker."""
    if rec.remote_prompt:
        return forward_subject(rec.reply), Forward(pe, work)
    return subjects.at(EP.PE_WORK, engine=pe), work


async def send(bus, rec: InFlight, pe: str, placed: Placed, subjects) -> None:
    """Publish a placement's work under its `assign` span (or with the request's context when unrecorded)."""
    if not recording():
        return await bus.publish(*addressed(rec, pe, placed.work, subjects), ctx=rec.ctx)
    with tracer.start_as_current_span("assign", context=rec.ctx, attributes=placed.span_attributes(rec)):
        await bus.publish(*addressed(rec, pe, placed.work, subjects))
