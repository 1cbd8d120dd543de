"""Network faults under load: a mesh whose hosts are namespaces, while links fail and recover.

Closed-loop agents on a 2P2D tiny mesh; faults one at a time (cut, loss, delay, partition).
Per fault: completed, failed cleanly, lost (must be 0), tokens unlike the single-process
reference (must be 0) and recovery time. Needs root.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from dualpath.bench.soak import Outcome, Soak
from dualpath.mesh import Mesh, MeshSpec

FAULTS = {  # name -> (host it hits, seconds it lasts, what it does)
    "cut": ("p0", 10.0, "link cut"),
    "loss": ("d2", 15.0, "5% packet loss"),
    "delay": ("p1", 15.0, "+50 ms latency"),
    "partition": ("nats", 5.0, "NATS host partitioned"),
}


@dataclass
class Row:
    fault: str
    host: str
    seconds: float
    requests: int = 0
    completed: int = 0
    failed_cleanly: int = 0
    lost: int = 0
    duplicated_tokens: int | None = None  # tokens of its completed streams unlike the reference (None: unchecked)
    recovery_s: float = 0.0
    serials: list[int] = field(default_factory=list)  # its completed requests (for the token check)


class Agents(Soak):
    """Soak's closed-loop agents, sending token ids; each completed stream is kept for the check."""

    def __init__(self, mesh: Mesh, timeout: float, tokenizer) -> None:
        super().__init__(mesh, timeout)
        self.tok = tokenizer
        self.started: dict[int, float] = {}  # serial -> start
        self.ended: dict[int, tuple[float, bool, bool]] = {}  # serial -> (end, completed, failed cleanly)
        self.streams: dict[int, tuple[list[int], int, list[int], int]] = {}  # serial -> (prompt, n, ids, streamed)

    def request(self, client: httpx.Client, prompt: str, n: int) -> str | None:
        ids = self.tok.encode(prompt)
        with self.lock:
            self.serial += 1
            me = self.serial
            self.inflight[me] = self.started[me] = time.monotonic()
        ok, clean, text, got, streamed = self._stream(client, ids, n)
        end = time.monotonic()
        with self.lock:
            self.inflight.pop(me, None)
            self.ended[me] = (end, ok, clean and not ok)
            if ok:
                self.streams[me] = (ids, n, got, streamed)
            self.outcomes.append(Outcome(end, ok, clean and not ok, 0.0))
            if not ok and not clean:
                self.lost += 1
        return text if ok else None

    def _stream(self, client: httpx.Client, ids: list[int], n: int) -> tuple[bool, bool, str, list[int], int]:
        """(completed, failed cleanly, text, token ids, tokens streamed) of one request."""
        body = {"prompt": ids, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True,
                "logprobs": 0, "return_token_ids": True, "stream_options": {"include_usage": True}}
        ok, clean, text, got, streamed = False, False, [], [], 0
        try:
            with client.stream("POST", self.mesh.url + "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    return False, "error" in json.loads(r.read() or b"{}"), "", [], 0
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        ok = not clean
                        break
                    ev = json.loads(line[6:])
                    if "error" in ev:
                        clean = True
                        continue
                    got = ev.get("token_ids", got)
                    for choice in ev["choices"]:
                        text.append(choice["text"])
                        streamed += len((choice.get("logprobs") or {}).get("tokens", []))
        except (httpx.HTTPError, ValueError):
            return False, False, "", [], 0  # a timeout or a broken stream: lost
        return ok, clean, "".join(text), got, streamed


def bad_tokens(reference, stream: tuple[list[int], int, list[int], int]) -> int:
    """Tokens of a completed stream that are not the reference's (repeated, stale, extra or missing)."""
    from shared.model.reference import generate_detailed

    ids, n, got, streamed = stream
    want = generate_detailed(reference, ids, n, top_logprobs=0, ignore_eos=True).ids
    wrong = sum(1 for a, b in zip(got, want) if a != b)
    return wrong + abs(len(got) - n) + abs(streamed - len(got))


def _healthy(mesh: Mesh, engines: int) -> bool:
    try:
        h = httpx.get(mesh.url + "/health", timeout=2).json()
        return h.get("prefill_engines", 0) + h.get("decode_engines", 0) >= engines
    except (httpx.HTTPError, ValueError):
        return False


def _recovered(mesh: Mesh, engines: int, limit: float = 120.0) -> float:
    """Seconds until every engine is assignable and a fresh request completes (limit: never)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if _healthy(mesh, engines):
            try:
                r = httpx.post(mesh.url + "/v1/completions", timeout=30,
                               json={"prompt": f"probe {time.time()}", "max_tokens": 2, "temperature": 0})
                if r.status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    return float("inf")


def inject(agents: Agents, name: str, engines: int) -> Row:
    host_name, seconds, _ = FAULTS[name]
    net = agents.mesh.net
    host = net.host(host_name)
    row = Row(name, host_name, seconds)
    t0 = time.monotonic()
    {"cut": net.links.cut, "partition": net.links.cut, "loss": lambda h: net.links.set_loss(h, 5.0),
     "delay": lambda h: net.links.set_delay(h, 50.0)}[name](host)
    time.sleep(seconds)
    net.links.clear(host)
    t1 = time.monotonic()
    row.recovery_s = _recovered(agents.mesh, engines)
    with agents.lock:
        during = [s for s, t in agents.started.items() if t < t1 and (s in agents.inflight or agents.ended[s][0] >= t0)]
    deadline = time.monotonic() + agents.timeout + 5
    while any(s in agents.inflight for s in during) and time.monotonic() < deadline:
        time.sleep(0.2)
    with agents.lock:
        row.lost = sum(1 for s in during if s in agents.inflight or not any(agents.ended[s][1:]))
        row.requests = len(during)
        row.completed = sum(1 for s in during if s in agents.ended and agents.ended[s][1])
        row.failed_cleanly = sum(1 for s in during if s in agents.ended and agents.ended[s][2])
        row.serials = [s for s in during if s in agents.streams]
    return row


def run(faults: list[str], agents_n: int = 4, calm: float = 8.0, gbps: float = 1.0, timeout: float = 60.0,
        token_check: bool = True) -> dict:
    deadline = "4"  # transfer deadlines (the defaults are 30 s): a peer behind a cut link is given up on quickly
    extra = {"scheduler": {"liveness-timeout-s": "2", "assign-timeout-s": "20"},
             "prefill_engine": {"handoff-timeout-s": deadline}, "decode_engine": {"load-timeout-s": deadline},
             "traffic_manager": {"transfer-timeout-s": deadline}}
    store = tempfile.mkdtemp(prefix="dualpath-netfaults-store-")
    spec = MeshSpec(model="tiny", port=0, prefill=2, decode=2, kv_blocks=128, buffer_mb=32, threads=1, extra=extra,
                    env={"DUALPATH_HEARTBEAT_S": "0.2"}, store=store, netns=True, link_gbps=gbps)
    from shared.model.loader import load_model

    reference = load_model("tiny", seed=0)  # the oracle every completed stream is checked against
    print(f"starting a 2P2D tiny mesh in network namespaces ({gbps:g} Gbit/s links) ...", file=sys.stderr, flush=True)
    mesh = Mesh(spec).start(timeout=180)
    agents = Agents(mesh, timeout, reference.tokenizer)
    threads = [threading.Thread(target=agents.agent, args=(i,), daemon=True) for i in range(agents_n)]
    rows = []
    try:
        for t in threads:
            t.start()
        for name in faults:
            time.sleep(calm)
            print(f"fault: {FAULTS[name][2]} ({FAULTS[name][0]}, {FAULTS[name][1]:g} s)", file=sys.stderr, flush=True)
            rows.append(inject(agents, name, 4))
        agents.stop.set()
        for t in threads:
            t.join(timeout + 5)
    finally:
        agents.stop.set()
        mesh.stop()
        shutil.rmtree(store, ignore_errors=True)
    res = _results(agents, rows, None)
    print("\n".join(table(res)), file=sys.stderr, flush=True)
    if not token_check:
        return res
    checked = sorted({s for r in rows for s in r.serials})  # streams that ran during a fault
    print(f"checking the {len(checked)} completed streams that ran during a fault against the reference ...",
          file=sys.stderr, flush=True)
    bad = {s: bad_tokens(reference, agents.streams[s]) for s in checked}
    return _results(agents, rows, bad)


def _results(agents: Agents, rows: list[Row], bad: dict[int, int] | None) -> dict:
    """The figures; `bad`: stream -> tokens unlike the reference (None: not checked)."""
    for r in rows:
        r.duplicated_tokens = None if bad is None else sum(bad.get(s, 0) for s in r.serials)
    return {"faults": [{k: v for k, v in asdict(r).items() if k != "serials"} for r in rows],
            "requests": len(agents.outcomes), "completed": sum(o.ok for o in agents.outcomes),
            "failed_cleanly": sum(o.clean_error for o in agents.outcomes), "lost": agents.lost,
            "duplicated_tokens": None if bad is None else sum(bad.values())}


def table(res: dict) -> list[str]:
    out = [f"{'fault':28}{'host':>6}{'s':>5}{'requests':>10}{'completed':>10}{'failed ok':>10}{'lost':>6}"
           f"{'dup tokens':>11}{'recovery s':>12}"]
    for r in res["faults"]:
        out.append(f"{FAULTS[r['fault']][2]:28}{r['host']:>6}{r['seconds']:>5.0f}{r['requests']:>10}"
                   f"{r['completed']:>10}{r['failed_cleanly']:>10}{r['lost']:>6}{_n(r['duplicated_tokens']):>11}"
                   f"{r['recovery_s']:>12.1f}")
    out.append(f"all requests {res['requests']}: completed {res['completed']}, failed cleanly "
               f"{res['failed_cleanly']}, lost {res['lost']}, duplicated tokens {_n(res['duplicated_tokens'])}")
    return out


def _n(v: int | None) -> str:
    return "unchecked" if v is None else str(v)


def build_parser() -> argparse.ArgumentParser:
    from dualpath.cli import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    ap.add_argument("--agents", type=int, default=4, help="agents in closed loops")
    ap.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, from {', '.join(FAULTS)}")
    ap.add_argument("--calm", type=float, default=8.0, help="seconds of load before each fault")
    ap.add_argument("--link-gbps", type=float, default=1.0, help="each node's link rate (tc)")
    ap.add_argument("--no-token-check", action="store_true", help="skip recomputing the streams by the reference")
    ap.add_argument("--json", default="", help="also write the results to this JSON file")
    return ap


def main(argv: list[str] | None = None) -> int:
    from dualpath.netns.fabric import probe

    ap = build_parser()
    a = ap.parse_args(argv)
    faults = [f.strip() for f in a.faults.split(",") if f.strip()]
    bad = [f for f in faults if f not in FAULTS]
    if bad:
        ap.error(f"--faults: unknown fault {bad[0]!r} (choose from {', '.join(FAULTS)})")
    if why := probe():
        print(f"dualpath.bench.netfaults: network namespaces: {why}", file=sys.stderr)
        return 2
    res = run(faults, a.agents, a.calm, a.link_gbps, token_check=not a.no_token_check)
    print("\n".join(table(res)))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0 if res["lost"] == 0 and not res["duplicated_tokens"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
