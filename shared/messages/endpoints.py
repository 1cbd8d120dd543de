"""Every subject of the mesh, in one table: its endpoint's name, pattern, message and reply types.

`EP.TM_PUSH.at(ns, engine=e)` builds a subject; nothing else builds one.
"""
from __future__ import annotations

from shared.messages.fleet import StoredKeys
from shared.messages.front import Answer, Ask, Forward, FrontInfo, FrontMsg
from shared.messages.journal import Accepted, Finished, JournalBatch
from shared.messages.registry import Announce
from shared.messages.storage_gateway import (HitQuery, HitReply, LayersRead, ReadBlocks, ReadDone, Retain,
                                             WriteBlock, WriteDone)
from shared.messages.stream import Output
from shared.messages.traffic_manager import (Claim, Claimed, FetchKV, FetchProgress, ForwardAlive, HoldSaves,
                                             LayersComputed, LoadKV, NodeReadDone, Prefetch, Prefetched, PushDone,
                                             PushKV, Release, Reserve, Reserved, SaveCopied, SaveKV, Stage, Staged,
                                             TmAttached)
from shared.messages.typed_subject import BusEndpoint, Subject
from shared.messages.work import Ack, Cancel, DecodeAdmit, PrefillWork

E = BusEndpoint


class EP:
    """The table. `E(name, pattern, message type[, reply type])`; a reply type: request/reply."""

    # mesh-wide
    HEARTBEAT = E("hb", "{ns}.hb", Announce)  # every process's announcement (registry)
    CANCEL = E("cancel", "{ns}.cancel", Cancel)  # broadcast: every holder frees the request
    # engines
    PE_WORK = E("pe.work", "{ns}.prefill_engine.{engine}.work", PrefillWork)  # scheduler -> PE
    PE_LOADED = E("pe.loaded", "{ns}.prefill_engine.{engine}.loaded", FetchProgress)  # its TM -> PE
    DE_ADMIT = E("de.admit", "{ns}.decode_engine.{engine}.admit", DecodeAdmit, Ack)  # PE -> DE
    ENGINE_TM = E("engine.tm", "{ns}.engine.{engine}.tm", TmAttached)  # its TM -> an engine
    # scheduler
    SCHED_OUT = E("scheduler.out", "{ns}.scheduler.{scheduler}.out", Output)  # engines -> a scheduler (worker)
    SCHED_FORWARD = E("scheduler.forward", "{ns}.scheduler.{scheduler}.out.work", Forward)  # core -> a worker
    SCHED_FRONT = E("scheduler.front", "{ns}.scheduler.{scheduler}.front", FrontMsg)  # workers -> core
    SCHED_ASK = E("scheduler.ask", "{ns}.scheduler.{scheduler}.ask", Ask, Answer)  # a worker -> core
    SCHED_INFO = E("scheduler.info", "{ns}.scheduler.{scheduler}.info", FrontInfo)  # core -> workers
    SCHED_WORKERS = E("scheduler.workers", "{ns}.scheduler.{scheduler}.workers", Announce)  # workers' beats
    READS_DONE = E("scheduler.reads_done", "{ns}.scheduler.reads_done", NodeReadDone)  # TMs -> schedulers
    # traffic managers, keyed by the engine each serves
    TM_PUSH = E("tm.push", "{ns}.traffic_manager.{engine}.push", PushKV, PushDone)
    TM_RESERVE = E("tm.reserve", "{ns}.traffic_manager.{engine}.reserve", Reserve, Reserved)
    TM_LOAD = E("tm.load", "{ns}.traffic_manager.{engine}.load", LoadKV, PushDone)
    TM_RELEASE = E("tm.release", "{ns}.traffic_manager.{engine}.release", Release)
    TM_FETCH = E("tm.fetch", "{ns}.traffic_manager.{engine}.fetch", FetchKV)  # progress on PE_LOADED
    TM_SAVE = E("tm.save", "{ns}.traffic_manager.{engine}.save", SaveKV, SaveCopied)
    TM_STAGE = E("tm.stage", "{ns}.traffic_manager.{engine}.stage", Stage, Staged)
    TM_COMPUTED = E("tm.computed", "{ns}.traffic_manager.{engine}.computed", LayersComputed)
    TM_ALIVE = E("tm.alive", "{ns}.traffic_manager.{engine}.alive", ForwardAlive)
    TM_READ_PROGRESS = E("tm.read_progress", "{ns}.traffic_manager.{engine}.read_progress", LayersRead)  # gateways
    TM_PREFETCH = E("tm.prefetch", "{ns}.traffic_manager.{engine}.prefetch", Prefetch, Prefetched)
    TM_CLAIM = E("tm.claim", "{ns}.traffic_manager.{engine}.claim", Claim, Claimed)
    TM_HOLD = E("tm.hold", "{ns}.traffic_manager.{engine}.hold", HoldSaves, Prefetched)
    # storage gateways, keyed by node; `any`: one gateway (a queue group) or every one
    SG_READ = E("sg.read", "{ns}.storage_gateway.{node}.read", ReadBlocks, ReadDone)
    SG_WRITE = E("sg.write", "{ns}.storage_gateway.{node}.write", WriteBlock, WriteDone)
    SG_HIT = E("sg.hit", "{ns}.storage_gateway.any.hit", HitQuery, HitReply)
    SG_RETAIN = E("sg.retain", "{ns}.storage_gateway.any.retain", Retain)
    # the fleet emulator's own (dualpath/fleet)
    FLEET_STORED = E("fleet.stored", "{ns}.fleet.stored", StoredKeys)
    FLEET_DUMP = E("fleet.dump", "{ns}.fleet.dump.{name}", StoredKeys, StoredKeys)
    # the scheduler's request journal (JetStream, JSON: services/scheduler/journal.py)
    JOURNAL_ACCEPTED = E("journal.accepted", "{ns}.journal.accepted", Accepted)
    JOURNAL_FINISHED = E("journal.finished", "{ns}.journal.finished", Finished)
    JOURNAL_BATCH = E("journal.batch", "{ns}.journal.batch", JournalBatch)


ENDPOINTS: tuple[BusEndpoint, ...] = tuple(v for v in vars(EP).values() if isinstance(v, BusEndpoint))
_FOUND: dict[str, BusEndpoint] = {}  # subject text -> its endpoint, for the reply addresses seen
_FOUND_MAX = 4096


def endpoint_of(subject: str) -> BusEndpoint:
    """The endpoint of `subject` (a `Subject`, or text looked up); ValueError when it is none."""
    if isinstance(subject, Subject):
        return subject.endpoint
    ep = _FOUND.get(subject)
    if ep is None:
        ep = next((e for e in ENDPOINTS if e.regex.match(subject)), None)
        if ep is None:
            raise ValueError(f"{subject!r} is no subject of the mesh (shared/messages/endpoints.py)")
        if len(_FOUND) >= _FOUND_MAX:
            _FOUND.clear()
        _FOUND[subject] = ep
    return ep


def forward_subject(reply: str) -> Subject:
    """Where the front-door worker whose output subject is `reply` takes `Forward`s."""
    got = EP.SCHED_OUT.parse(reply)
    if got is None:
        raise ValueError(f"{reply!r} is no scheduler output subject")
    return EP.SCHED_FORWARD.at(**got)


def journal_subjects(ns: str) -> str:
    """The journal stream's subject filter: every `JOURNAL_*` subject of mesh `ns`."""
    return f"{ns}.journal.>"
