"""One emulator process: many emulated engines, their traffic-managers' and gateways' announcements.

One asyncio loop and one NATS connection for every node given; each service announces as the real
one does, gateways answer hit queries, engines serve their subjects. Stops on SIGTERM.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from pathlib import Path

import msgspec

from dualpath.fleet.decode import DecodeEngine
from dualpath.fleet.prefill import PrefillEngine
from dualpath.fleet.store import StoreIndex
from dualpath.fleet.timing import FleetTiming
from dualpath.presets import load_arch
from shared.beats import Beats, engine_beat_key
from shared.bus import Bus, Delivery
from shared.kv.hashing import ModelFingerprint
from shared.kv.layout import KVKind, KVLayout
from shared.messages.endpoints import EP
from shared.messages.fleet import StoredKeys
from shared.messages.registry import StorageGatewayAnnounce, TrafficManagerAnnounce
from shared.messages.storage_gateway import HitQuery, HitReply, StoreLayout
from shared.messages.subjects import Subjects
from shared.messages.work import Cancel
from shared.service_config import CommonConfig
from shared.transport.base import EndpointDesc

TICK_S = 0.025  # heartbeat phases are spread over this grid
SHARE_S = 0.2  # store keys are shared this often


def fleet_layout(model: str, block: int = 64) -> StoreLayout:
    """The store layout the emulated engines announce: the preset's layer count, a one-plane row."""
    arch = load_arch(model)
    kv = KVLayout(arch.num_layers, 1, 576, "bfloat16", block, KVKind.GQA)
    fp = ModelFingerprint.from_layout(arch.name, kv)
    return StoreLayout(fingerprint=fp.digest(), model_id=arch.name, n_layers=kv.n_layers, n_kv_heads=1,
                       head_dim=576, dtype="bfloat16", block_size=block)


def parse_nodes(text: str) -> list[tuple[str, str, int]]:
    """`p0:prefill:8,d0:decode:8` -> [(node, role, engines), ...]; ValueError naming a bad entry."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        parts = item.split(":")
        if len(parts) != 3 or parts[1] not in ("prefill", "decode") or not parts[2].isdigit() or int(parts[2]) < 1:
            raise ValueError(f"--nodes entry {item!r}: expected NODE:prefill|decode:ENGINES")
        out.append((parts[0], parts[1], int(parts[2])))
    if not out:
        raise ValueError("--nodes names no node")
    return out


class FleetGroup:
    """The `EngineHost` of every emulated engine of this process."""

    def __init__(self, bus: Bus, args: argparse.Namespace):
        self.bus, self.name = bus, args.name
        self.subjects = Subjects(args.namespace)
        self.timing = FleetTiming.build(args.model, args.hardware, args.decode_engines, scale=args.time_scale)
        self.layout = fleet_layout(args.model, args.block_size)
        self.store = StoreIndex()
        self.quota_s, self.max_context, self.heartbeat_s = args.quota_s, args.max_context, args.heartbeat_s
        self.out = Path(args.out)
        self.tasks: set[asyncio.Task] = set()
        self.read_free: dict[str, float] = {}  # node -> when its storage NIC has read what is queued
        self.work_at: dict[str, float] = {}  # request -> when its first PrefillWork arrived (monotonic)
        self.lag = [0.0, 0]  # heartbeat ticks: summed lateness, count
        self.engines: dict[str, PrefillEngine | DecodeEngine] = {}
        self.services: list = []  # (announce callable, what of it counts as a change, its Beats)
        quiet = args.quiet_beats
        for node, role, n in parse_nodes(args.nodes):
            self.services.append((self._gateway(node), _whole, Beats(quiet)))
            for i in range(n):
                eid = f"{node}-e{i}"
                cls = PrefillEngine if role == "prefill" else DecodeEngine
                eng = cls(self, eid, node, f"{role[0]}e-{eid}")
                self.engines[eid] = eng
                self.services.append((eng.announce, engine_beat_key, Beats(quiet)))
                self.services.append((self._tm(eid, node), _whole, Beats(quiet)))

    # Host ---------------------------------------------------------------------------
    def read_done_at(self, node: str, tokens: int, now: float) -> float:
        at = max(now, self.read_free.get(node, 0.0)) + self.timing.read_s(tokens)
        self.read_free[node] = at
        return at

    def note_work(self, req_id: str) -> None:
        base = req_id.partition("#")[0]
        self.work_at.setdefault(base, time.monotonic())

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # announcements --------------------------------------------------------------------
    def _gateway(self, node: str):
        def announce() -> StorageGatewayAnnounce:
            backlog = max(0.0, self.read_free.get(node, 0.0) - time.monotonic())
            nbytes = int(backlog / self.timing.scale * self.timing.hw.snic_bw)
            return StorageGatewayAnnounce(instance=f"sg-{node}", node=node, metrics_url="", pid=os.getpid(),
                                          read_q_blocks=nbytes // max(1, self.layout.block_size *
                                                                      self.timing.model.kv_bytes),
                                          read_q_bytes=nbytes, store_root="/emulated",
                                          read_bytes_per_s=self.timing.hw.snic_bw)
        return announce

    def _tm(self, engine: str, node: str):
        desc = msgspec.msgpack.encode(EndpointDesc("tcp", engine, f"host-{node}", os.getpid(), "127.0.0.1", 1))
        buffer = 80 << 30

        def announce() -> TrafficManagerAnnounce:
            return TrafficManagerAnnounce(instance=f"tm-{engine}", node=node, metrics_url="", pid=os.getpid(),
                                          engine=engine, endpoint=desc, buffer_bytes=buffer,
                                          buffer_free_bytes=buffer, ready=True)
        return announce

    async def heartbeats(self, stop: asyncio.Event) -> None:
        """Every service's announcement once per `heartbeat_s`, each at its own phase of the period."""
        slots = max(1, round(self.heartbeat_s / TICK_S))
        by_slot = [self.services[i::slots] for i in range(slots)]
        t0 = time.monotonic()
        tick = 0
        while not stop.is_set():
            due = t0 + tick * TICK_S
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.lag[0] += -delay
            self.lag[1] += 1
            await self.beat(by_slot[tick % slots])
            tick += 1

    async def beat(self, services: list) -> int:
        """One beat of these services: each announcement the quiet-beats rule lets out; how many."""
        sent = 0
        for announce, key, beats in services:
            msg = announce()
            if beats.due(key(msg)):
                await self.bus.publish(self.subjects.at(EP.HEARTBEAT), msg)
                sent += 1
        return sent

    async def leave(self) -> None:
        for announce, _, _ in self.services:
            msg = announce()
            msg.leaving = True
            await self.bus.publish(self.subjects.at(EP.HEARTBEAT), msg)

    # store and gateways -------------------------------------------------------------------
    async def on_hit(self, q: HitQuery, d: Delivery) -> None:
        await d.respond(HitReply(blocks=self.store.hit_length(q.block_keys)))

    async def on_stored(self, msg: StoredKeys, d: Delivery) -> None:
        if msg.source != self.name:
            self.store.add(msg.block_keys, share=False)

    async def share_store(self, stop: asyncio.Event) -> None:
        subject = self.subjects.at(EP.FLEET_STORED)
        while not stop.is_set():
            await asyncio.sleep(SHARE_S)
            fresh = self.store.take_fresh()
            for i in range(0, len(fresh), 20_000):  # well under NATS's 1 MB payload limit
                await self.bus.publish(subject, StoredKeys(self.name, fresh[i:i + 20_000]))

    async def on_dump(self, msg: StoredKeys, d: Delivery) -> None:
        """Write what this process measured (work arrival times, engine counters) and answer."""
        self.out.mkdir(parents=True, exist_ok=True)
        pes = [e for e in self.engines.values() if isinstance(e, PrefillEngine)]
        des = [e for e in self.engines.values() if isinstance(e, DecodeEngine)]
        doc = {"name": self.name, "pid": os.getpid(), "work_at": self.work_at,
               "forwards": sum(e.forwards for e in pes), "steps": sum(e.steps for e in des),
               "tokens": sum(e.tokens for e in des), "store_keys": len(self.store.keys),
               "heartbeat_lag_s": self.lag[0] / max(1, self.lag[1]), "services": len(self.services)}
        (self.out / f"{self.name}.msgpack").write_bytes(msgspec.msgpack.encode(doc))
        await d.respond(StoredKeys(self.name, []))

    # intake routing -------------------------------------------------------------------------
    async def on_cancel(self, msg: Cancel, d: Delivery) -> None:
        for eng in self.engines.values():
            if msg.req_id in eng.held:
                eng.cancel(msg.req_id)

    async def start(self, stop: asyncio.Event) -> None:
        s, bus = self.subjects, self.bus
        for eid, eng in self.engines.items():
            if isinstance(eng, PrefillEngine):
                await bus.subscribe(s.at(EP.PE_WORK, engine=eid), eng.on_work)
            else:
                await bus.subscribe(s.at(EP.DE_ADMIT, engine=eid), eng.on_admit)
            self.spawn(eng.run())
        await bus.subscribe(s.at(EP.CANCEL), self.on_cancel)
        await bus.subscribe(s.at(EP.SG_HIT), self.on_hit, queue="hit")
        await bus.subscribe(s.at(EP.FLEET_STORED), self.on_stored)
        await bus.subscribe(s.at(EP.FLEET_DUMP, name=self.name), self.on_dump)
        self.spawn(self.heartbeats(stop))
        self.spawn(self.share_store(stop))


def _whole(msg: object) -> object:
    return msg


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dualpath.fleet.group", description=__doc__.split("\n\n")[0])
    p.add_argument("--nats-url", required=True)
    p.add_argument("--namespace", default="dp")
    p.add_argument("--name", default="g0", help="this process's name (its dump subject and file)")
    p.add_argument("--nodes", required=True, help="NODE:prefill|decode:ENGINES, comma-separated")
    p.add_argument("--model", default="ds-v3.2-660b", help="simulator model preset (timing, layout)")
    p.add_argument("--hardware", default="h800", help="simulator hardware preset")
    p.add_argument("--decode-engines", type=int, default=8, help="decode GPUs of the whole fleet (expert parallelism)")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--max-context", type=int, default=131072)
    p.add_argument("--quota-s", type=float, default=0.3, help="intra-PE compute quota per forward (simulator's)")
    p.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per modelled second (tests: < 1)")
    p.add_argument("--heartbeat-s", type=float, default=0.5, help="announce period (the services' default)")
    p.add_argument("--quiet-beats", type=int, default=CommonConfig.quiet_beats,
                   help="unchanged announcements skipped in a row, as the services' setting (0 = every beat)")
    p.add_argument("--out", default=".", help="where a dump writes <name>.msgpack")
    return p


async def serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    bus = await Bus.connect(args.nats_url, f"fleet-{args.name}", wait_s=30.0)
    group = FleetGroup(bus, args)
    await group.start(stop)
    await stop.wait()
    await group.leave()
    for task in list(group.tasks):
        task.cancel()
    await bus.close()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        parse_nodes(args.nodes)
    except ValueError as exc:
        print(f"fleet group: {exc}")
        return 2
    import uvloop

    uvloop.run(serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
