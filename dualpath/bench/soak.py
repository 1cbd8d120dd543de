"""Soak under faults: agents in closed loops near capacity while processes are killed and restarted.

Every request must complete or fail cleanly within the client timeout; anything else is LOST.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import statistics
import sys
import threading
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from dualpath.bench.procstat import status_mb
from dualpath.mesh import Mesh, MeshSpec

FAULTS = ("decode-", "prefill-", "tm-p", "gateway-p")  # the process killed, in turn


@dataclass
class Outcome:
    t: float
    ok: bool
    clean_error: bool
    ttft: float


@dataclass
class FaultRow:
    fault: str
    at: float
    in_flight: int = 0
    completed: int = 0
    failed_cleanly: int = 0
    lost: int = 0
    recovery_s: float = 0.0


@dataclass
class Soak:
    mesh: Mesh
    timeout: float = 60.0
    outcomes: list[Outcome] = field(default_factory=list)
    inflight: dict[int, float] = field(default_factory=dict)  # request serial -> start time
    lost: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    serial: int = 0

    def agent(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=self.timeout) as client:
            while not self.stop.is_set():
                context = f"agent {seed} session {rng.random():.6f}: " + "tool output line; " * rng.randint(5, 40)
                for _turn in range(rng.randint(2, 6)):
                    if self.stop.is_set():
                        return
                    text = self.request(client, context, rng.randint(8, 48))
                    if text is None:
                        break
                    context += text + " tool: ok; " * rng.randint(1, 10)

    def request(self, client: httpx.Client, prompt: str, n: int) -> str | None:
        with self.lock:
            self.serial += 1
            me = self.serial
            self.inflight[me] = time.monotonic()
        t0 = time.monotonic()
        ttft, ok, clean, text = 0.0, False, False, []
        body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
        try:
            with client.stream("POST", self.mesh.url + "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    clean = "error" in json.loads(r.read() or b"{}")
                else:
                    for line in r.iter_lines():
                        if not line.startswith("data: "):
                            continue
                        data = line[6:]
                        if data == "[DONE]":
                            ok = not clean
                            break
                        ev = json.loads(data)
                        if "error" in ev:
                            clean = True
                            continue
                        ttft = ttft or time.monotonic() - t0
                        text.append(ev["choices"][0]["text"])
        except (httpx.HTTPError, ValueError):
            pass  # a timeout or a broken stream: lost
        with self.lock:
            self.inflight.pop(me, None)
            self.outcomes.append(Outcome(time.monotonic(), ok, clean and not ok, ttft))
            if not ok and not clean:
                self.lost += 1
        return "".join(text) if ok else None


def _healthy(mesh: Mesh, pes: int, des: int) -> bool:
    try:
        h = httpx.get(mesh.url + "/health", timeout=2).json()
        return h.get("prefill_engines", 0) >= pes and h.get("decode_engines", 0) >= des
    except (httpx.HTTPError, ValueError):
        return False


def inject(soak: Soak, prefix: str, restart_after: float) -> FaultRow:
    mesh = soak.mesh
    victim = next(p for p in mesh.procs if p.name.startswith(prefix) and p.popen.poll() is None)
    row = FaultRow(victim.name, time.monotonic(), in_flight=len(soak.inflight))
    before = set(soak.inflight)
    mesh.kill(victim, signal.SIGKILL)
    time.sleep(restart_after)
    mesh.restart(victim)
    t_restart = time.monotonic()
    while not _healthy(mesh, 2, 2) and time.monotonic() - t_restart < 60:
        time.sleep(0.2)
    row.recovery_s = time.monotonic() - row.at
    deadline = time.monotonic() + soak.timeout
    while set(soak.inflight) & before and time.monotonic() < deadline:
        time.sleep(0.2)
    done = [o for o in soak.outcomes if o.t >= row.at]
    row.completed = sum(o.ok for o in done)
    row.failed_cleanly = sum(o.clean_error for o in done)
    row.lost = len(set(soak.inflight) & before)  # still hanging after the client timeout
    return row


def leaks(mesh: Mesh, timeout: float = 20.0) -> list[str]:
    """Engines or traffic-managers not back to all-free once the load is gone (empty = none)."""
    deadline = time.monotonic() + timeout
    while True:
        view = httpx.get(mesh.url + "/v1/mesh", timeout=5).json()
        bad = [f"{e['engine']}: {e['free_blocks']}/{e['total_blocks']} KV blocks free"
               for e in view["engines"] if e["free_blocks"] != e["total_blocks"] or e["seq"]]
        bad += [f"tm {t['engine']}: buffer {t['buffer_free_bytes']}/{t['buffer_bytes']} free"
                for t in view["traffic_managers"] if t["buffer_free_bytes"] != t["buffer_bytes"]]
        if not bad or time.monotonic() > deadline:
            return bad
        time.sleep(0.5)


def torn_blocks(store: Path) -> list[str]:
    """Stored Full Blocks whose header or payload checksum does not verify (empty = none)."""
    from shared.kv.full_block import HEADER_SIZE, decode_header, verify_payload

    bad = []
    for path in store.rglob("*.kvb"):
        data = path.read_bytes()
        try:
            verify_payload(decode_header(data[:HEADER_SIZE]), memoryview(data)[HEADER_SIZE:])
        except Exception as exc:  # noqa: BLE001 - any failure is a torn or bad block
            bad.append(f"{path.name}: {exc}")
    return bad


def run(minutes: float, agents: int, fault_every: float, warmup: float, min_faults: int = 0) -> dict:
    """Soak for `minutes`, a fault every `fault_every` s, and at least `min_faults` faults."""
    deadline = "4"  # transfer deadlines (the defaults are 30 s): a dead peer is given up on quickly
    extra = {"scheduler": {"liveness-timeout-s": "2", "assign-timeout-s": "20"},
             "prefill_engine": {"handoff-timeout-s": deadline}, "decode_engine": {"load-timeout-s": deadline},
             "traffic_manager": {"transfer-timeout-s": deadline},
             "storage_gateway": {"capacity-gb": "0.05"}}  # a bounded store: LRU eviction runs all along
    store = Path(tempfile.mkdtemp(prefix="dualpath-soak-store-"))
    spec = MeshSpec(model="tiny", port=0, prefill=2, decode=2, kv_blocks=128, buffer_mb=32, threads=1, extra=extra,
                    env={"DUALPATH_HEARTBEAT_S": "0.2"}, store=str(store))
    print(f"starting a 2P2D tiny mesh, then {warmup:g} s of load before the first fault ...", file=sys.stderr,
          flush=True)
    mesh = Mesh(spec).start(timeout=120)
    soak = Soak(mesh)
    threads = [threading.Thread(target=soak.agent, args=(i,), daemon=True) for i in range(agents)]
    try:
        for t in threads:
            t.start()
        time.sleep(warmup)
        stable = {p.name: p.popen.pid for p in mesh.procs if not p.name.startswith(FAULTS) and p.name != "nats"}
        # RssAnon: the process's own heap. VmRSS also counts shared-memory pages (KV memory, TM
        # buffers) as they are first touched, which grows toward their fixed size and is not a leak.
        rss0 = {n: status_mb(pid, "RssAnon") for n, pid in stable.items()}
        t_start, rows, k = time.monotonic(), [], 0
        while time.monotonic() - t_start < minutes * 60 or k < min_faults:
            time.sleep(fault_every)
            print(f"[{time.monotonic() - t_start:4.0f} s] fault {k + 1}: SIGKILL {FAULTS[k % len(FAULTS)]}",
                  file=sys.stderr, flush=True)
            rows.append(inject(soak, FAULTS[k % len(FAULTS)], restart_after=2.0))
            k += 1
        rss1 = {n: status_mb(pid, "RssAnon") for n, pid in stable.items()}
        soak.stop.set()
        for t in threads:
            t.join(soak.timeout + 5)
        leaked = leaks(mesh)
    finally:
        soak.stop.set()
        mesh.stop()
    torn = torn_blocks(store)
    shutil.rmtree(store, ignore_errors=True)
    window = max(30.0, minutes * 60 / 4)
    first = [o.ttft for o in soak.outcomes if o.ok and o.t - t_start < window]
    last = [o.ttft for o in soak.outcomes if o.ok and o.t > soak.outcomes[-1].t - window]
    return {"faults": [asdict(r) for r in rows], "requests": len(soak.outcomes),
            "completed": sum(o.ok for o in soak.outcomes), "failed_cleanly": sum(o.clean_error for o in soak.outcomes),
            "lost": soak.lost, "rss_mb_after_warmup": rss0, "rss_mb_end": rss1,
            "ttft_first": _pcts(first), "ttft_last": _pcts(last), "leaks": leaked, "torn_blocks": torn}


def _pcts(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    xs = sorted(xs)
    return {"n": len(xs), "p50_s": statistics.median(xs), "p99_s": xs[min(len(xs) - 1, int(0.99 * len(xs)))]}


def build_parser() -> argparse.ArgumentParser:
    from dualpath.cli import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    ap.add_argument("--minutes", type=float, default=3.0, help="how long faults are injected")
    ap.add_argument("--agents", type=int, default=6, help="agents in closed loops")
    ap.add_argument("--fault-every", type=float, default=20.0, help="seconds between faults")
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds of load before the first fault")
    ap.add_argument("--json", default="", help="also write the results to this JSON file")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    res = run(a.minutes, a.agents, a.fault_every, a.warmup)
    print(f"{'fault (SIGKILL, restart 2 s later)':36}{'in flight':>10}{'completed':>10}{'failed ok':>10}"
          f"{'lost':>6}{'recovery s':>12}")
    for r in res["faults"]:
        print(f"{r['fault']:36}{r['in_flight']:>10}{r['completed']:>10}{r['failed_cleanly']:>10}{r['lost']:>6}"
              f"{r['recovery_s']:>12.1f}")
    print(f"requests {res['requests']}: completed {res['completed']}, failed cleanly {res['failed_cleanly']}, "
          f"lost {res['lost']}")
    print("resident anonymous memory (RssAnon, MiB), after warm-up -> end:")
    for name, mb in res["rss_mb_after_warmup"].items():
        end = res["rss_mb_end"][name]
        print(f"  {name:24}{mb:8.1f} -> {end:8.1f}  ({(end - mb) / mb * 100 if mb else 0:+.1f}%)")
    print(f"after the load: {len(res['leaks'])} engines/TMs not back to all-free {res['leaks'] or ''}; "
          f"{len(res['torn_blocks'])} torn stored blocks")
    f, l_ = res["ttft_first"], res["ttft_last"]
    if f.get("n") and l_.get("n"):
        print(f"TTFT first window p50 {f['p50_s'] * 1e3:.0f} ms p99 {f['p99_s'] * 1e3:.0f} ms; "
              f"last window p50 {l_['p50_s'] * 1e3:.0f} ms p99 {l_['p99_s'] * 1e3:.0f} ms")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=2)
    return 0 if res["lost"] == 0 and not res["leaks"] and not res["torn_blocks"] else 1


if __name__ == "__main__":  # one benchmark at a time; its load and CPU said at the end
    from shared.benchrun import alone

    raise SystemExit(alone("dualpath.bench.soak", lambda conditions: main()))
