"""Garbage on the bus: every subject a service subscribes to gets bytes that are not
msgpack, msgpack of the wrong schema and truncated real messages, published plainly and as
requests with a reply inbox. Every service must log, count and drop them
(`dualpath_bus_bad_messages_total` on its /metrics), stay alive, and the mesh must still
complete a normal request.
"""
from __future__ import annotations

import asyncio
import re

import httpx
import msgspec
import nats
import pytest

from shared.messages.endpoints import ENDPOINTS, EP
from shared.messages.registry import EngineAnnounce
from shared.messages.storage_gateway import ReadBlocks, StoreLayout
from shared.messages.stream import TokenEvent
from shared.messages.traffic_manager import FetchKV, PushKV, ReadFinished
from shared.messages.work import DecodeAdmit, PrefillWork, Sampling
from tests.integration.meshutil import complete, tiny_mesh

pytestmark = pytest.mark.integration

LAYOUT = StoreLayout(fingerprint=b"\xab" * 16, model_id="m", n_layers=2, n_kv_heads=1, head_dim=4, dtype="f32",
                     block_size=4)
REAL = [  # real messages, truncated before sending (never sent whole)
    PrefillWork("fz-1", list(range(40)), Sampling(max_tokens=3), "nowhere", "nowhere", [b"\xaa" * 16] * 3),
    DecodeAdmit("fz-2", 40, 7, Sampling(), "nowhere", [0, 4096, 8192], prompt=list(range(40))),
    PushKV("fz-3", [1, 2, 3], "nowhere", 40, [0, 1, 2]),
    FetchKV("fz-4", [b"\xaa" * 16] * 2, [1, 2], "n", LAYOUT, 2),
    ReadBlocks("fz-5", LAYOUT, [b"\xaa" * 16], "shm", [0]),
    TokenEvent("fz-6", [1, 2, 3], 0, None, "", "e"),
    ReadFinished("fz-8", 2, [0, 4096], [0, 1]),
    EngineAnnounce(instance="fz-7", node="n", engine="fz-e", role="prefill", max_context=64),
]
WRONG_SCHEMA = [msgspec.msgpack.encode(v) for v in (
    {}, {"req_id": 5}, {"kind": "nope", "instance": 1}, [1, 2, 3], "text", 7, None, 3.5, b"\x00\x01",
    {"req_id": "x", "prompt": "not a list", "sampling": {}}, {"kind": "engine"}, [["deep"] * 3] * 3,
    {"req_id": "x", "tokens": "nope"},
)]
GARBAGE = [b"", b"\x00", b"\xff" * 64, b"\xc1", b"not msgpack at all", bytes(range(256)), b"\x91" * 5_000,
           b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xffabc"]


def payloads() -> list[bytes]:
    cut = []
    for msg in REAL:
        raw = msgspec.msgpack.encode(msg)
        cut += [raw[: len(raw) // 2], raw[:-1], raw[:1]]
    return GARBAGE + WRONG_SCHEMA + cut


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    m = tiny_mesh(tmp_path_factory.mktemp("garbage"))
    m.start(timeout=120)
    yield m
    m.stop()


def subjects(ns: str, view: dict) -> list[str]:
    """Every subject the services subscribe to, for the live engines/nodes/scheduler (the table's)."""
    out = [EP.HEARTBEAT.at(ns), EP.CANCEL.at(ns), EP.SG_HIT.at(ns), EP.SG_RETAIN.at(ns), EP.READS_DONE.at(ns)]
    for e in view["engines"]:
        out += [ep.at(ns, engine=e["engine"]) for ep in ENDPOINTS if ep.params == ("engine",)]
    for g in view["gateways"]:
        out += [ep.at(ns, node=g["node"]) for ep in ENDPOINTS if ep.params == ("node",)]
    for s in view["schedulers"]:
        out += [ep.at(ns, scheduler=s["instance"]) for ep in ENDPOINTS if ep.params == ("scheduler",)]
    return out


def counters(url: str) -> dict[str, float]:
    text = httpx.get(url, timeout=10).text
    found = dict(re.findall(r"^(dualpath_bus_\w+_total) (\S+)$", text, re.M))
    return {k: float(v) for k, v in found.items()}


async def spray(nats_url: str, subs: list[str]) -> int:
    nc = await nats.connect(nats_url)
    sent = 0
    try:
        for subject in subs:
            for i, data in enumerate(payloads()):
                reply = nc.new_inbox() if i % 2 else ""  # half as requests with a reply inbox
                await nc.publish(subject, data, reply=reply)
                sent += 1
        await nc.flush()
    finally:
        await nc.close()
    return sent


def test_mesh_view_names_every_process(mesh):
    view = httpx.get(mesh.url + "/v1/mesh", timeout=10).json()
    assert {e["role"] for e in view["engines"]} == {"prefill", "decode"}
    assert len(view["gateways"]) == 2 and len(view["schedulers"]) == 1 and len(view["traffic_managers"]) == 2
    assert all(row["metrics_url"] for key in ("engines", "traffic_managers", "gateways", "schedulers")
               for row in view[key])


def test_garbage_on_every_subject_is_counted_and_dropped(mesh):
    view = httpx.get(mesh.url + "/v1/mesh", timeout=10).json()
    procs = {row["instance"]: row["metrics_url"]
             for key in ("engines", "traffic_managers", "gateways", "schedulers") for row in view[key]}
    before = {inst: counters(url) for inst, url in procs.items()}
    assert all("dualpath_bus_bad_messages_total" in c and "dualpath_bus_handler_errors_total" in c
               for c in before.values()), before

    sent = asyncio.run(spray(mesh.nats_url, subjects(mesh.spec.namespace, view)))
    assert sent > 1_000

    mesh.check_alive()
    r = complete(mesh.url, {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    after = {inst: counters(url) for inst, url in procs.items()}
    n = len(payloads())
    for inst in procs:  # every process subscribes to at least one family: each saw most of n payloads
        rose = after[inst]["dualpath_bus_bad_messages_total"] - before[inst]["dualpath_bus_bad_messages_total"]
        assert rose >= n // 2, (inst, before[inst], after[inst])
    mesh.check_alive()
