"""The endpoint table (shared/messages/endpoints.py): its types, its patterns, the bus checking
and decoding by it, and no subject string built anywhere else (AST scan of the project and tests)."""
from __future__ import annotations

import ast
import asyncio
import dataclasses
import re
import typing
from pathlib import Path
from types import SimpleNamespace, UnionType

import msgspec
import pytest

from shared.bus import Bus
from shared.messages.endpoints import ENDPOINTS, EP, endpoint_of, forward_subject
from shared.messages.stream import StepEvents, TokenEvent
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import LayersLoaded, PushDone, PushKV, Release, Reserved
from shared.messages.typed_subject import Subject
from shared.messages.work import PrefillWork, Sampling

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("services", "shared", "dualpath", "kernels", "deploy", "tests")
TABLE = "shared/messages/endpoints.py"
SCANNER = "tests/unit/test_endpoints.py"  # this file: its samples of hand-built subjects


def _members(tp) -> list:
    if isinstance(tp, UnionType) or typing.get_origin(tp) is typing.Union:
        return [m for a in typing.get_args(tp) for m in _members(a)]
    return [tp]


def _is_message(tp) -> bool:
    """A Struct, or a dataclass msgspec encodes as a map (stream.StepEvents: see its docstring)."""
    return isinstance(tp, type) and (issubclass(tp, msgspec.Struct) or dataclasses.is_dataclass(tp))


def _params(ep, form: str = "{}-1") -> dict[str, str]:
    return {p: form.format(p) for p in ep.params}


# --- the table --------------------------------------------------------------------------------------

@pytest.mark.parametrize("ep", ENDPOINTS, ids=lambda e: e.name)
def test_every_endpoint_carries_structs_or_unions_of_them(ep):
    for tp in (ep.msg, ep.reply):
        if tp is None:
            continue
        for m in _members(tp):
            if typing.get_origin(m) is list:  # a batch (the journal's): a list of messages
                assert all(_is_message(i) for i in _members(typing.get_args(m)[0])), (ep.name, m)
            else:
                assert _is_message(m), (ep.name, m)
        msgspec.msgpack.Decoder(tp)  # one decoder for the whole union


def test_names_and_patterns_are_unique_and_every_subject_finds_its_own_endpoint():
    assert len({ep.name for ep in ENDPOINTS}) == len({ep.pattern for ep in ENDPOINTS}) == len(ENDPOINTS) >= 35
    for ns, form in (("dp", "{}-1"), ("t1a2b3", "{}-1"), ("a.b", "{}-1"), ("dp", "{}.host.x")):  # dots: as ever
        for ep in ENDPOINTS:
            subject = ep.at(ns, **_params(ep, form))
            assert isinstance(subject, Subject) and subject.endpoint is ep
            assert endpoint_of(str(subject)) is ep, (ns, ep.name, [e.name for e in ENDPOINTS if e.parse(subject)])
            assert [e for e in ENDPOINTS if e.parse(subject)] == [ep]  # no other pattern matches it at all
            assert ep.parse(str(subject)) == {"ns": ns, **_params(ep, form)}


def test_the_table_names_every_subject_of_today():
    expected = {"hb", "cancel", "pe.work", "pe.loaded", "de.admit", "engine.tm", "scheduler.out", "scheduler.forward",
                "scheduler.front", "scheduler.ask", "scheduler.info", "scheduler.workers", "scheduler.reads_done",
                "sg.read", "sg.write", "sg.hit", "sg.retain", "fleet.stored", "fleet.dump", "journal.accepted",
                "journal.finished", "journal.batch"}
    tm = {"push", "reserve", "load", "release", "fetch", "save", "stage", "computed", "alive", "read_progress",
          "prefetch", "claim", "hold"}
    assert {ep.name for ep in ENDPOINTS} == expected | {f"tm.{v}" for v in tm}
    assert {ep.name for ep in ENDPOINTS if ep.reply is not None} == {
        "de.admit", "scheduler.ask", "tm.push", "tm.reserve", "tm.load", "tm.save", "tm.stage", "tm.prefetch",
        "tm.claim", "tm.hold", "sg.read", "sg.write", "sg.hit", "fleet.dump"}


def test_a_subject_is_built_only_with_its_parameters_each_one_token():
    assert Subjects("ns1").at(EP.TM_PUSH, engine="pe0") == "ns1.traffic_manager.pe0.push"
    assert forward_subject("ns1.scheduler.c-w0.out") == "ns1.scheduler.c-w0.out.work"
    for bad in ({}, {"engine": "a", "node": "b"}, {"node": "b"}):
        with pytest.raises(ValueError, match="tm.push: takes engine"):
            EP.TM_PUSH.at("ns", **bad)
    for value in ("", "a*", ">", "a b"):
        with pytest.raises(ValueError, match="empty, or holds a wildcard or a space"):
            EP.TM_PUSH.at("ns", engine=value)
    with pytest.raises(ValueError, match="ns=''"):
        EP.CANCEL.at("")
    dotted = EP.SCHED_OUT.at("ns", scheduler="host.example")  # a dotted name works as it always did
    assert endpoint_of(str(dotted)) is EP.SCHED_OUT and forward_subject(dotted) == "ns.scheduler.host.example.out.work"
    assert endpoint_of(str(EP.TM_READ_PROGRESS.at("ns", engine="pe.0"))) is EP.TM_READ_PROGRESS
    with pytest.raises(ValueError, match="no subject of the mesh"):
        endpoint_of("ns.nowhere")
    with pytest.raises(ValueError, match="no scheduler output subject"):
        forward_subject("ns.cancel")


# --- the bus checks and decodes by it -----------------------------------------------------------------

class _Nc:
    """What the bus uses of a NATS client: records publishes, answers requests with `answer`."""

    def __init__(self, answer: bytes = b""):
        self.sent: list[tuple[str, bytes]] = []
        self.subs: dict[str, typing.Callable] = {}
        self.answer = answer

    async def publish(self, subject, data, headers=None):
        self.sent.append((subject, data))

    async def request(self, subject, data, timeout, headers=None):
        self.sent.append((subject, data))
        return SimpleNamespace(data=self.answer)

    async def subscribe(self, subject, queue="", cb=None):
        self.subs[subject] = cb


def test_the_bus_refuses_a_message_of_another_type_naming_the_endpoint_and_sends_nothing():
    bus, push = Bus(_Nc(), "t"), EP.TM_PUSH.at("t", engine="pe0")
    named = r"endpoint tm\.push \(t\.traffic_manager\.pe0\.push\) carries PushKV, not Release"
    with pytest.raises(TypeError, match=named):
        asyncio.run(bus.publish(push, Release("r")))
    with pytest.raises(TypeError, match=r"endpoint tm\.push .* carries PushKV, not Release"):
        asyncio.run(bus.request(push, Release("r")))
    with pytest.raises(TypeError, match=r"endpoint tm\.release .* takes no requests"):
        asyncio.run(bus.request(EP.TM_RELEASE.at("t", engine="pe0"), Release("r")))
    with pytest.raises(TypeError, match=r"endpoint scheduler\.out .* carries TokenEvent \| StepEvents, not PushKV"):
        asyncio.run(bus.publish("t.scheduler.s1.out", PushKV("r", [], "de0")))  # a reply address, as text
    with pytest.raises(ValueError, match="no subject of the mesh"):
        asyncio.run(bus.publish("t.somewhere", Release("r")))
    assert bus.nc.sent == []


def test_the_bus_decodes_a_reply_and_a_subscriptions_messages_with_the_endpoints_types():
    nc = _Nc(answer=msgspec.msgpack.encode(PushDone(slots=[4096])))
    bus = Bus(nc, "t")
    push, out = EP.TM_PUSH.at("t", engine="pe0"), EP.SCHED_OUT.at("t", scheduler="s1")
    assert asyncio.run(bus.request(push, PushKV("r", [1], "de0"))) == PushDone(slots=[4096])
    work = PrefillWork("r#0", [1, 2], Sampling(), "de0", out)  # a typed subject inside a message goes as text
    asyncio.run(bus.publish(EP.PE_WORK.at("t", engine="pe0"), work))
    assert msgspec.msgpack.decode(nc.sent[-1][1], type=PrefillWork).reply == "t.scheduler.s1.out"

    got: list = []

    async def handler(msg, d) -> None:
        got.append(msg)
        await d.respond(Reserved() if len(got) == 1 else PushDone(nbytes=8))

    asyncio.run(bus.subscribe(push, handler))
    cb = nc.subs[push]
    for _ in range(2):
        asyncio.run(cb(SimpleNamespace(data=msgspec.msgpack.encode(PushKV("r", [1], "de0")), subject=push,
                                       reply="_INBOX.1", headers=None)))
    assert got == [PushKV("r", [1], "de0")] * 2
    assert bus.handler_errors == 1  # the first answer was no PushDone: refused, nothing sent
    assert nc.sent[-1][0] == "_INBOX.1" and msgspec.msgpack.decode(nc.sent[-1][1], type=PushDone).nbytes == 8

    loaded: list = []

    async def on_loaded(msg, d) -> None:
        loaded.append(msg)

    asyncio.run(bus.subscribe(EP.PE_LOADED.at("t", engine="pe0"), on_loaded))  # a union: decoded by its tag
    asyncio.run(nc.subs["t.prefill_engine.pe0.loaded"](SimpleNamespace(
        data=msgspec.msgpack.encode(LayersLoaded("r", 3)), subject="", reply="", headers=None)))
    assert loaded == [LayersLoaded("r", 3)]
    EP.SCHED_OUT.check(StepEvents([TokenEvent("r", [1])]))  # the dataclass member passes too


# --- no subject built outside the table ------------------------------------------------------------------

FAMILIES = sorted({ep.pattern.split(".")[1] for ep in ENDPOINTS})  # hb, cancel, traffic_manager, ...
VERBS = sorted({ep.pattern.rsplit(".", 1)[-1] for ep in ENDPOINTS if not ep.pattern.endswith("}")})
_FAMILY = re.compile(r"^\.(%s)(\.|$)" % "|".join(FAMILIES))  # "{ns}" + ".traffic_manager..."
_TAIL = re.compile(r"^\.(%s|>)$" % "|".join(VERBS))  # reply + ".work", prefix + ".>"
_PATTERN = re.compile(r"\{\w*\}\.(%s)\b" % "|".join(FAMILIES))  # "{ns}.hb".format(...)


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def subjects_built(source: str) -> list[int]:
    """Lines of `source` that build a subject: an f-string or a `+` that joins text to a family or
    verb of the table (`f"{ns}.hb"`, `reply + ".work"`), or a pattern-shaped literal to format."""
    tree, hits = ast.parse(source), []
    docs = _docstrings(tree)
    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr):
            for a, b in zip(n.values, n.values[1:]):
                if isinstance(a, ast.FormattedValue) and isinstance(b, ast.Constant) and \
                        (_FAMILY.match(b.value) or (b is n.values[-1] and _TAIL.match(b.value))):
                    hits.append(n.lineno)
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add) and isinstance(n.right, ast.Constant) \
                and isinstance(n.right.value, str) and (_FAMILY.match(n.right.value) or _TAIL.match(n.right.value)):
            hits.append(n.lineno)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs \
                and _PATTERN.search(n.value):
            hits.append(n.lineno)
    return sorted(set(hits))


@pytest.mark.parametrize("code", [
    'f"{ns}.traffic_manager.{engine}.{verb}"', 'f"{self.ns}.hb"', 'f"{ns}.fleet.dump.{name}"', 'reply + ".work"',
    'self.prefix + ".>"', 'f"{prefix}.{verb}"[0] if 0 else f"{reply}.work"', '"{ns}.cancel".format(ns=ns)',
])
def test_the_scan_finds_a_subject_built_by_hand(code):
    assert subjects_built(code) == [1]


def test_no_subject_is_built_outside_the_table():
    found = {}
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in (TABLE, SCANNER) and (lines := subjects_built(path.read_text())):
                found[rel] = lines
    assert not found, f"build these with the endpoint table ({TABLE}: EP.<NAME>.at(ns, ...)): {found}"
