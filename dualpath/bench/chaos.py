"""The fault-and-cancel matrix: each process kind killed or frozen, and clients that leave, in each phase.

A cell passes when its streamed and non-streamed requests both end (every token once, or an
error), nothing stays held and the next request is served.
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import shutil
import signal
import socket
import sys
import threading
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from shared.benchrun import Conditions, start

KINDS = {  # kind -> the process-name prefix in the mesh
    "scheduler": "scheduler", "prefill": "prefill-", "decode": "decode-", "tm-p": "tm-p", "tm-d": "tm-d",
    "gateway-p": "gateway-p", "gateway-d": "gateway-d", "nats": "nats"}
ACTIONS = ("kill", "freeze", "leave")
PHASES = ("prefill", "decode", "persist")  # at the request's start, after its first tokens, after its end
GEN = 48
PROMPT = "the fault and cancel matrix keeps every request's life short and clean " * 5


@dataclass
class Ending:
    how: str = "hung"  # exact | wrong | error: ... | left | lost connection | hung
    tokens: list[int] = field(default_factory=list)
    stamps: list[float] = field(default_factory=list)
    ended: float = 0.0


@dataclass
class Cell:
    kind: str
    action: str
    phase: str
    repeat: int
    stream: str = ""
    plain: str = ""
    detect_s: float = -1.0  # fault -> the scheduler resumed or failed a request (-1: it had nothing to do)
    resume_s: float = -1.0  # fault -> the first token after it (-1: none)
    leaks: list[str] = field(default_factory=list)
    next_ok: bool = False
    passed: bool = False


def _stream(url: str, body: dict, out: Ending, leave: threading.Event, timeout: float) -> None:
    try:
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True, "stream_options": {
                "include_usage": True}}, timeout=timeout) as r:
            if r.status_code != 200:  # answered at once, with an error body
                r.read()
                out.how = f"error: {r.status_code} {r.json().get('error', {}).get('message', '')}"
            for line in r.iter_lines() if r.status_code == 200 else ():
                if leave.is_set():
                    out.how = "left"
                    break
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    out.how = f"error: {chunk['error'].get('message', '')}"
                elif chunk.get("choices"):
                    out.stamps.append(time.monotonic())
                elif "token_ids" in chunk:
                    out.tokens, out.how = chunk["token_ids"], "done"
        if out.how == "hung":  # the stream closed cleanly without its last chunk
            out.how = "lost connection (no last chunk)"
    except httpx.TimeoutException:
        out.how = "hung"
    except httpx.TransportError as exc:
        out.how = f"lost connection ({type(exc).__name__})"
    out.ended = time.monotonic()


def _plain(url: str, body: dict, out: Ending, leave: threading.Event, timeout: float) -> None:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    reader = threading.Thread(target=_post, args=(conn, body, out), daemon=True)
    reader.start()
    while reader.is_alive() and not leave.wait(0.02):
        pass
    if leave.is_set() and reader.is_alive():
        out.how = "left"
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_RDWR)  # the client leaves: its connection closes
    reader.join(timeout)
    conn.close()
    out.ended = out.ended or time.monotonic()


def _post(conn: http.client.HTTPConnection, body: dict, out: Ending) -> None:
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        doc = json.loads(r.read())
        if r.status == 200:
            out.tokens, out.how = doc["choices"][0]["token_ids"], "done"
        else:
            out.how = f"error: {r.status} {doc.get('error', {}).get('message', '')}"
    except socket.timeout:
        out.how = "hung"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        out.how = out.how if out.how == "left" else f"lost connection ({type(exc).__name__})"
    out.ended = time.monotonic()


def _acted(url: str) -> float | None:
    """The scheduler's resumes plus failed requests (a change means it acted on a fault); None: no answer."""
    try:
        text = httpx.get(url + "/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("dualpath_scheduler_request_resumes_total ",
                            'dualpath_scheduler_requests_total{status="error"}')):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _watch(url: str, since: float, before: float | None, stop: threading.Event, cell: Cell) -> None:
    while not stop.wait(0.02):
        now = _acted(url)
        if now is not None and before is not None and now > before:
            cell.detect_s = time.monotonic() - since
            return


def _fault(mesh, kind: str, action: str, hold_s: float) -> None:
    victim = next(p for p in mesh.procs if p.name.startswith(KINDS[kind]) and p.popen.poll() is None)
    if action == "kill":
        victim.popen.send_signal(signal.SIGKILL)  # the supervisor restarts it, as `dualpath up` does
        return
    victim.popen.send_signal(signal.SIGSTOP)
    time.sleep(hold_s)  # frozen past the liveness timeout: the point of the cell
    victim.popen.send_signal(signal.SIGCONT)


def _outcome(e: Ending, want: list[int]) -> str:
    if e.how == "done":
        return "exact" if e.tokens == want else f"wrong ({sum(a != b for a, b in zip(e.tokens, want))} differ)"
    return e.how


def run_cell(mesh, ref: list[int], prompt: list[int], cell: Cell, liveness_s: float) -> Cell:
    from dualpath.bench.soak import leaks, torn_blocks

    body = {"prompt": prompt, "max_tokens": GEN, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    guard = 6 * liveness_s + 60  # a hang guard only: a cell that reaches it failed
    s, p, leave, stop = Ending(), Ending(), threading.Event(), threading.Event()
    threads = [threading.Thread(target=_stream, args=(mesh.url, body, s, leave, guard), daemon=True),
               threading.Thread(target=_plain, args=(mesh.url, body, p, leave, guard), daemon=True)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + guard
    while cell.phase == "decode" and len(s.stamps) < 3 and not s.ended and time.monotonic() < deadline:
        time.sleep(0.005)
    while cell.phase == "persist" and not (s.ended and p.ended) and time.monotonic() < deadline:
        time.sleep(0.005)  # both answered: the decode engine and TMs are persisting their blocks
    at, before = time.monotonic(), _acted(mesh.url)
    watcher = threading.Thread(target=_watch, args=(mesh.url, at, before, stop, cell), daemon=True)
    watcher.start()
    if cell.action == "leave":
        leave.set()
    else:
        _fault(mesh, cell.kind, cell.action, 1.5 * liveness_s)
    for t in threads:
        t.join(guard)
    stop.set()
    after = [t for t in s.stamps if t > at]
    cell.resume_s = after[0] - at if after else -1.0
    cell.stream, cell.plain = _outcome(s, ref), _outcome(p, ref)
    _wait_healthy(mesh, guard)
    cell.leaks = leaks(mesh, timeout=3 * liveness_s + 10) + [f"torn block {b}" for b in torn_blocks(Path(mesh.spec.store))]
    cell.next_ok = _next_ok(mesh.url, body, ref)
    good = {"exact", "left"}
    cell.passed = (all(o in good or o.startswith(("error", "lost connection")) for o in (cell.stream, cell.plain))
                   and not cell.leaks and cell.next_ok
                   and (cell.action == "leave" or cell.kind in ("scheduler", "nats") or cell.detect_s <= 2 * liveness_s
                        or cell.detect_s < 0))
    return cell


def _wait_up(mesh, guard: float) -> None:
    """Every process of the mesh running again (the supervisor restarted what died) and healthy."""
    deadline = time.monotonic() + guard
    while time.monotonic() < deadline and any(p.popen.poll() is not None for p in mesh.procs):
        time.sleep(0.1)
    _wait_healthy(mesh, max(1.0, deadline - time.monotonic()))


def _wait_healthy(mesh, guard: float) -> None:
    deadline = time.monotonic() + guard
    while time.monotonic() < deadline:
        try:
            h = httpx.get(mesh.url + "/health", timeout=2).json()
            if h.get("status") == "ok" and not h.get("running") and not h.get("queued"):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.1)


def _next_ok(url: str, body: dict, ref: list[int]) -> bool:
    try:
        r = httpx.post(url + "/v1/completions", json={**body, "max_tokens": 4}, timeout=120)
        return r.status_code == 200 and r.json()["choices"][0]["token_ids"] == ref[:4]
    except httpx.HTTPError:
        return False


def cells(kinds: list[str], repeats: int, leave: bool = True) -> list[Cell]:
    out = [Cell(k, a, ph, r) for r in range(repeats) for k in kinds for a in ("kill", "freeze") for ph in PHASES]
    if leave:
        out += [Cell("client", "leave", ph, r) for r in range(repeats) for ph in PHASES[:2]]
    return out


def run(todo: list[Cell], log_dir: str = "", say=print) -> list[Cell]:
    """Run `todo`'s cells in order on one mesh (a store of its own, removed after)."""
    store = tempfile.mkdtemp(prefix="dualpath-chaos-store-")
    try:
        return _run(todo, log_dir, store, say)
    finally:
        shutil.rmtree(store, ignore_errors=True)


def _run(todo: list[Cell], log_dir: str, store: str, say) -> list[Cell]:
    from dualpath.mesh import Mesh, MeshSpec
    from dualpath.supervisor import Supervisor
    from shared.model.loader import load_model
    from shared.model.reference import generate

    liveness = 2.0
    spec = MeshSpec(model="tiny", port=0, kv_blocks=96, buffer_mb=16, threads=1, log_dir=log_dir, store=store,
                    extra={"scheduler": {"liveness-timeout-s": str(liveness)}}, env={"DUALPATH_HEARTBEAT_S": "0.2"})
    model = load_model("tiny", seed=0)
    prompt = model.tokenizer.encode(PROMPT)
    ref = generate(model, prompt, GEN, ignore_eos=True)
    done: list[Cell] = []
    with Mesh(spec) as mesh:
        sup, stop = Supervisor(mesh, say=lambda line: None), threading.Event()
        ticker = threading.Thread(target=lambda: [sup.tick() for _ in iter(lambda: stop.wait(0.1), True)], daemon=True)
        ticker.start()
        try:
            _next_ok(mesh.url, {"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
                                "return_token_ids": True}, ref)  # warm, and the prompt's blocks stored
            for cell in todo:
                _wait_up(mesh, 120)
                try:
                    done.append(run_cell(mesh, ref, prompt, cell, liveness))
                except Exception as exc:  # noqa: BLE001 - a cell that breaks the driver is a failed cell
                    cell.stream = cell.stream or f"driver: {type(exc).__name__}: {exc}"
                    done.append(cell)
                say(row(done[-1]) + "".join(f"\n    leak: {x}" for x in done[-1].leaks))
        finally:
            stop.set()
            ticker.join(5)
    return done


def row(c: Cell) -> str:
    t = lambda x: f"{x:5.2f}" if x >= 0 else "    -"  # noqa: E731
    return (f"{c.kind:10} {c.action:6} {c.phase:7} #{c.repeat}  stream {c.stream[:34]:34} plain {c.plain[:34]:34} "
            f"detect {t(c.detect_s)} s  resume {t(c.resume_s)} s  leaks {len(c.leaks)}  next "
            f"{'ok' if c.next_ok else 'FAILED'}  {'pass' if c.passed else 'FAIL'}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dualpath.bench.chaos", description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"process kinds to fault, of {', '.join(KINDS)}")
    ap.add_argument("--json", default="", help="write {cells, conditions} here")
    ap.add_argument("--log-dir", default="", help="keep the mesh's logs here")
    return ap


def main(argv: list[str] | None = None, conditions: Conditions | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    conditions = conditions or start("dualpath.bench.chaos")
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad or args.repeats < 1:
        print(f"chaos: unknown kind {bad[0]!r} (of {', '.join(KINDS)})" if bad else
              f"chaos: --repeats {args.repeats} must be >= 1", file=sys.stderr)
        return 2
    done = run(cells(kinds, args.repeats), args.log_dir)
    failed = [c for c in done if not c.passed]
    print(f"{len(done) - len(failed)} passed, {len(failed)} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cells": [asdict(c) for c in done], "conditions": conditions.measure().report()}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":  # one benchmark at a time; its load and CPU said at the end
    from shared.benchrun import alone

    raise SystemExit(alone("dualpath.bench.chaos", lambda conditions: main(conditions=conditions)))
