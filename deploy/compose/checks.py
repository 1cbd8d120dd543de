"""What `make compose-check` asserts against a running compose stack (deploy/compose/check.py).

Each check takes the Stack and the scheduler's published URL, talks to the stack the
way a user would (HTTP on the published port, `docker exec`, `docker kill`) and raises
CheckFailed naming what it saw when the stack misbehaves; on success it returns a short
line for the report. Owns the assertions only: starting, scaling and tearing down the
stack are check.py's; the compose calls are stack.py's.
"""
from __future__ import annotations

import json
import secrets
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from stack import Stack, StackError

LOGPROB_TOLERANCE = 1e-4  # fp32: the same prompt, with and without the store, within this
MESH = ("scheduler", "prefill-engine", "decode-engine", "storage-gateway-prefill", "storage-gateway-decode")
# service -> its /metrics ports inside the container (9101: the traffic-manager beside an engine)
METRICS_PORTS = {"scheduler": (9100,), "prefill-engine": (9100, 9101), "decode-engine": (9100, 9101),
                 "storage-gateway-prefill": (9100,), "storage-gateway-decode": (9100,)}
WANTED_SERVICES = {"scheduler", "prefill-engine", "decode-engine", "traffic-manager"}  # OTel service.name
# Metric names the checks read, all here (services may rename theirs): each is a tuple of
# names, the first one a service exposes counts; put a new name first, keep the old.
METRIC_PREFIX = "dualpath_"
WORK_METRICS = {  # a counter that grows when an engine of this kind gets work
    "prefill-engine": ("dualpath_prefill_engine_requests_total", "dualpath_prefill_requests_total"),
    "decode-engine": ("dualpath_decode_engine_tokens_total", "dualpath_decode_tokens_total"),
}
PERSISTED_METRIC = ("dualpath_decode_engine_persisted_blocks_total", "dualpath_decode_persisted_blocks_total")
BLOCK = 64


class CheckFailed(AssertionError):
    """A check saw the stack misbehave; `check` names it, `seen` is what it saw."""

    def __init__(self, check: str, seen: str):
        super().__init__(f"{check}: {seen}")
        self.check = check
        self.seen = seen


def _expect(cond: bool, check: str, seen) -> None:
    if not cond:
        raise CheckFailed(check, str(seen)[:2000])


def _wait(cond, check: str, what: str, timeout: float, every: float = 0.5):
    """Poll `cond()` until it returns a truthy value (returned) or `timeout` runs out (CheckFailed)."""
    start = time.monotonic()
    last = None
    while time.monotonic() - start < timeout:
        last = cond()
        if last:
            return last
        time.sleep(every)
    raise CheckFailed(check, f"{what}: not seen within {timeout:.0f}s (last: {last!r})"[:2000])


def complete(url: str, prompt: str, n: int = 16, **extra) -> dict:
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, **extra}
    r = httpx.post(url + "/v1/completions", json=body, timeout=300)
    if r.status_code != 200:
        raise CheckFailed("completion", f"HTTP {r.status_code}: {r.text[:500]}")
    return r.json()


def prompt_text(tag: str, words: int = 160) -> str:
    """A prompt of several KV blocks, unique to `tag` (so no earlier run's blocks match)."""
    return f"Run {tag}. Tool output follows.\n" + " ".join(f"line {i}: ok;" for i in range(words // 3))


# -- the checks ---------------------------------------------------------------------------------

def check_completion(stack: Stack, url: str) -> str:
    r = complete(url, "The capital of France is", 12)
    text = r["choices"][0]["text"]
    _expect(r["usage"]["completion_tokens"] == 12 and text, "completion", r)
    return f"completion: 12 tokens, {text!r}"


def check_streamed_chat(stack: Stack, url: str) -> str:
    body = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 12,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    deltas, usage, done = [], None, False
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        _expect(r.status_code == 200, "streamed chat", f"HTTP {r.status_code}: {r.read()[:300]!r}")
        _expect(r.headers.get("content-type", "").startswith("text/event-stream"), "streamed chat",
                r.headers.get("content-type"))
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                _expect("error" not in chunk, "streamed chat", chunk)
                usage = chunk.get("usage") or usage
                deltas += [c["delta"].get("content") or "" for c in chunk["choices"]]
    text = "".join(deltas)
    _expect(done and text and usage and usage["completion_tokens"] > 0, "streamed chat",
            f"done={done} text={text!r} usage={usage}")
    return f"streamed chat: {sum(1 for d in deltas if d)} content chunks, {usage['completion_tokens']} tokens, [DONE]"


def _store_files(stack: Stack) -> int:
    cid = stack.ids("storage-gateway-decode")[0]
    done = stack.exec_in(cid, "sh", "-c", "find /var/lib/dualpath/store -name '*.kvb' | wc -l")
    return int(done.stdout.strip() or 0) if done.returncode == 0 else 0


def check_store_reuse(stack: Stack, url: str, tag: str) -> str:
    """The same prompt, to an empty store and then from the store: same tokens, same logprobs."""
    prompt = prompt_text(tag)
    before = _store_files(stack)
    first = complete(url, prompt, 16, logprobs=0, return_token_ids=True)
    _expect(first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, "store: first ask is a miss",
            first["usage"])
    full = first["usage"]["prompt_tokens"] // BLOCK  # the prompt's full blocks: what a second ask can hit
    _expect(full >= 2, "store: prompt spans blocks", first["usage"])
    try:
        _wait(lambda: _store_files(stack) - before >= full, "store", f"{full} prompt blocks persisted", 120)
    except CheckFailed as exc:
        de = stack.ids("decode-engine")[0]
        handed = metric_value(metrics_text(stack, de, 9100), PERSISTED_METRIC)
        raise CheckFailed("store", f"{exc.seen}; {_store_files(stack) - before} new block files, the decode "
                                   f"engine handed {handed:.0f} blocks to persistence") from None
    misses = []  # asks after the blocks were in the store that still missed (reported, at most 2)
    while True:
        second = complete(url, prompt, 16, logprobs=0, return_token_ids=True)
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        if cached > 0 or len(misses) == 2:
            break
        misses.append(second["usage"])
        time.sleep(1.0)
    _expect(cached > 0, "store: second ask loads from the store", f"{second['usage']}; earlier misses {misses}")
    a, b = first["choices"][0], second["choices"][0]
    _expect(a["token_ids"] == b["token_ids"], "store: same tokens", (a["token_ids"], b["token_ids"]))
    diff = max(abs(x - y) for x, y in zip(a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"],
                                          strict=True))
    _expect(diff <= LOGPROB_TOLERANCE, "store: same logprobs", f"max |diff| {diff:.3g}")
    # the next turn of the conversation: its prefix comes from the store
    turn2 = prompt + b["text"] + "\nTool: tests passed. Next step?\n"
    third = complete(url, turn2, 8)
    cached2 = third["usage"]["prompt_tokens_details"]["cached_tokens"]
    _expect(cached2 >= cached, "store: next turn reuses the prefix", third["usage"])
    late = f" (after {len(misses)} asks that still missed: {misses})" if misses else ""
    return (f"store: miss then hit{late} ({cached}/{second['usage']['prompt_tokens']} prompt tokens cached), "
            f"same 16 tokens, max |logprob diff| {diff:.2e}; next turn {cached2} cached")


def metrics_text(stack: Stack, container: str, port: int) -> str:
    """GET /metrics from inside the container (on the address the service binds)."""
    code = ("import socket, sys, urllib.request; h = socket.gethostbyname(socket.gethostname()); "
            f"sys.stdout.write(urllib.request.urlopen(f'http://{{h}}:{port}/metrics', timeout=10).read().decode())")
    done = stack.exec_in(container, "python", "-c", code)
    if done.returncode != 0:
        raise CheckFailed("metrics", f"{container}:{port}: {done.stderr[-500:]}")
    return done.stdout


def metric_value(text: str, names: tuple[str, ...]) -> float:
    """The sum of the samples of the first of `names` that `text` has (CheckFailed when none)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            totals[s.name] = totals.get(s.name, 0.0) + s.value
    for name in names:
        if name in totals:
            return totals[name]
    raise CheckFailed("metrics", f"none of {names} exposed; {METRIC_PREFIX}* seen: "
                                 f"{sorted(n for n in totals if n.startswith(METRIC_PREFIX))[:30]}")


def check_metrics(stack: Stack, url: str) -> str:
    from prometheus_client.parser import text_string_to_metric_families

    seen = []
    for service, ports in METRICS_PORTS.items():
        ids = stack.ids(service)
        _expect(ids, "metrics", f"no running {service} container")
        for cid in ids:
            for port in ports:
                fams = [f.name for f in text_string_to_metric_families(metrics_text(stack, cid, port))]
                _expect(any(f.startswith(METRIC_PREFIX) for f in fams), "metrics",
                        f"{service} {cid[:12]}:{port} has no {METRIC_PREFIX} metric: {fams[:8]}")
                seen.append(f"{service}:{port}")
    return f"metrics: Prometheus text on {len(seen)} ports ({', '.join(sorted(set(seen)))})"


def check_scaled_engines_work(stack: Stack, url: str, tag: str) -> str:
    """With two replicas of each engine service, both of each receive work."""
    pes, des = stack.ids("prefill-engine"), stack.ids("decode-engine")
    _expect(len(pes) == 2 and len(des) == 2, "scale", f"prefill {len(pes)}, decode {len(des)} replicas")

    def work() -> dict[str, float]:
        out = {}
        for cid in pes:
            out[cid] = metric_value(metrics_text(stack, cid, 9100), WORK_METRICS["prefill-engine"])
        for cid in des:
            out[cid] = metric_value(metrics_text(stack, cid, 9100), WORK_METRICS["decode-engine"])
        return out

    base = work()
    rounds = 0
    with ThreadPoolExecutor(8) as pool:
        while rounds < 6:
            rounds += 1
            prompts = [prompt_text(f"{tag}-scale-{rounds}-{i}", 90) for i in range(8)]
            list(pool.map(lambda p: complete(url, p, 8), prompts))
            now = work()
            if all(now[c] > base[c] for c in now):
                short = {c[:12]: now[c] - base[c] for c in now}
                return f"scale: 2 prefill + 2 decode engines all got work after {rounds * 8} requests: {short}"
    raise CheckFailed("scale", f"an engine got no work in {rounds * 8} requests: {work()} (before {base})")


_KILL_ENGINE = """
import os, signal, sys
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
        except OSError:
            continue
        if b"service" in cmd and sys.argv[1].encode() in cmd:
            os.kill(int(pid), signal.SIGKILL); print(pid); break
"""


def _shm(stack: Stack, cid: str) -> set[str]:
    return set(stack.exec_in(cid, "ls", "/dev/shm").stdout.split())


def check_stopping_a_replica_spares_its_siblings(stack: Stack, url: str, service: str = "prefill-engine") -> str:
    """Replicas of one node share its /dev/shm volume but not a pid namespace (their processes
    have the same pids): stopping one must remove its own segments only, and the rest serve."""
    ids = stack.ids(service)
    _expect(len(ids) >= 2, "replica stop", f"{len(ids)} {service} replicas")
    keep, stop = ids[0], ids[-1]
    before = _shm(stack, keep)
    done = subprocess.run(["docker", "stop", "-t", "20", stop], capture_output=True, text=True)
    _expect(done.returncode == 0, "replica stop", done.stderr)
    after = _shm(stack, keep)
    _expect(after and after < before, "replica stop", f"/dev/shm before {sorted(before)}, after {sorted(after)}")
    r = _wait(lambda: _try_complete(url), "replica stop", "a completion with one replica stopped", 180, 1.0)
    done = subprocess.run(["docker", "start", stop], capture_output=True, text=True)
    _expect(done.returncode == 0, "replica stop", f"docker start: {done.stderr}")
    return (f"replica stop: {service} {stop[:12]} stopped, its {len(before - after)} /dev/shm segments gone, "
            f"the {len(after)} of {keep[:12]} kept; served ({r['usage']['completion_tokens']} tokens); started again")


CRASH_SIGNAL = "SIGUSR1"  # `docker kill --signal` this: the entry script dies of it, as of a crash


def kill_engine(stack: Stack, cid: str, service: str, how: str) -> str:
    """Kill an engine container's work the way a crash would.
    `process`: SIGKILL to the engine process inside the container (its entry script then
    ends the pair and the container exits non-zero);
    `docker-kill`: `docker kill --signal SIGUSR1`, which the container's init passes to
    the entry script, which dies of it. Plain `docker kill` (SIGKILL) or the stop signal
    is a manual stop to Docker: no restart policy restarts a container stopped that way."""
    if how == "process":
        done = stack.exec_in(cid, "python", "-c", _KILL_ENGINE, service)
        _expect(done.returncode == 0 and done.stdout.strip(), "kill", f"no {service} process: {done.stderr}")
        return f"engine process (pid {done.stdout.strip()} in the container) SIGKILLed"
    if how == "docker-kill":
        done = subprocess.run(["docker", "kill", "--signal", CRASH_SIGNAL, cid], capture_output=True, text=True)
        _expect(done.returncode == 0, "kill", f"docker kill: {done.stderr}")
        return f"`docker kill --signal {CRASH_SIGNAL}`"
    raise ValueError(f"kill how: process or docker-kill, not {how!r}")


def check_killed_engine_restarts(stack: Stack, url: str, service: str = "prefill-engine",
                                 how: str = "process") -> str:
    """A killed engine container is restarted by its restart policy and the stack serves again."""
    cid = stack.ids(service)[0]
    info = stack.inspect(cid)
    restarts = info["RestartCount"]
    started = info["State"]["StartedAt"]
    t0 = time.monotonic()
    what = kill_engine(stack, cid, service, how)

    def back() -> bool:
        s = stack.inspect(cid)
        return (s["State"]["StartedAt"] != started and s["State"]["Running"]
                and (s["State"].get("Health") or {}).get("Status") == "healthy")

    try:
        _wait(back, "kill", f"{service} {cid[:12]} restarted by its policy and healthy", 300, 1.0)
    except CheckFailed as exc:
        s = stack.inspect(cid)
        raise CheckFailed("kill", f"{exc.seen}; after {what}: {s['State']['Status']}, exit code "
                                  f"{s['State']['ExitCode']}, RestartCount {s['RestartCount']}") from None
    restarted_s = time.monotonic() - t0
    after = stack.inspect(cid)["RestartCount"]
    _expect(after > restarts, "kill", f"RestartCount {restarts} -> {after}")
    # the scheduler drops the dead engine and takes the new one: the stack serves again
    r = _wait(lambda: _try_complete(url), "kill", "a completion after the restart", 180, 1.0)
    served_s = time.monotonic() - t0
    shm = stack.exec_in(cid, "sh", "-c", "ls /dev/shm").stdout.split()
    return (f"kill: {service} {cid[:12]}: {what}; restarted by its policy (RestartCount {restarts}->{after}), "
            f"healthy in {restarted_s:.0f}s, serving again at {served_s:.0f}s "
            f"({r['usage']['completion_tokens']} tokens); the node's /dev/shm holds {len(shm)} segments: {shm}")


def _try_complete(url: str) -> dict | None:
    try:
        r = httpx.post(url + "/v1/completions", json={"prompt": "Hello again", "max_tokens": 4,
                                                       "temperature": 0, "ignore_eos": True}, timeout=120)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


def check_traces(stack: Stack, url: str, otlp_url: str, tag: str) -> str:
    """Each request's spans reach the OTLP endpoint as ONE trace across the services."""
    rids = [complete(url, prompt_text(f"{tag}-trace-{i}", 90), 6)["id"] for i in range(2)]

    def spans() -> list[dict]:
        return httpx.get(otlp_url + "/spans", timeout=30).json()

    def traced(rid: str):
        """The request's trace once it is whole: every wanted service, every parent exported
        (services export in batches, and a parent span is exported when it ends)."""
        got = spans()
        roots = [s for s in got if s["attributes"].get("req_id") == rid and not s["parent_id"]]
        if not roots:
            return None
        trace = [s for s in got if s["trace_id"] == roots[0]["trace_id"]]
        ids = {s["span_id"] for s in trace}
        whole = all(s["parent_id"] in ids for s in trace if s["parent_id"])
        return trace if whole and {s["service"] for s in trace} >= WANTED_SERVICES else None

    out = []
    for rid in rids:
        trace = _wait(lambda: traced(rid), "traces",
                      f"spans of {rid} from {sorted(WANTED_SERVICES)}, every parent among them", 120, 1.0)
        got = spans()
        mine = [s for s in got if s["attributes"].get("req_id") == rid]
        roots = [s for s in mine if not s["parent_id"]]
        _expect(len(roots) == 1, "traces", f"{rid}: {len(roots)} root spans")
        _expect({s["trace_id"] for s in mine} == {trace[0]["trace_id"]}, "traces",
                f"{rid}: its spans are in {len({s['trace_id'] for s in mine})} traces")
        ids = {s["span_id"] for s in trace}
        orphans = [s["name"] for s in trace if s["parent_id"] and s["parent_id"] not in ids]
        _expect(not orphans, "traces", f"{rid}: spans whose parent is missing: {orphans}")
        out.append(f"{len(trace)} spans from {len({s['service'] for s in trace})} services")
    return "traces: each request one trace at the OTLP endpoint: " + "; ".join(out)


_NATS_PROBE = """
import asyncio, os, sys
import nats
async def main(url):
    try:
        nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=5)
    except Exception as exc:
        print("REFUSED", type(exc).__name__, exc); return
    # the data-plane secret the traffic managers keep in JetStream KV: readable with the credentials
    from services.traffic_manager.secret import KEY, bucket_name
    try:
        kv = await nc.jetstream(timeout=5).key_value(bucket_name(sys.argv[2]))
        entry = await kv.get(KEY)
        kv_state = f"KV {bucket_name(sys.argv[2])}/{KEY}: {len(entry.value or b'')} bytes"
    except Exception as exc:
        kv_state = f"KV {type(exc).__name__}: {exc}"
    await nc.close(); print("CONNECTED", kv_state)
asyncio.run(main(sys.argv[1]))
"""


def check_nats_credentials(stack: Stack, url: str, user: str, password: str, namespace: str = "dp") -> str:
    """NATS refuses a client without (or with wrong) credentials; with them, the mesh's
    JetStream KV bucket holds the data-plane secret the traffic managers made."""
    cid = stack.ids("scheduler")[0]
    seen: dict[str, str] = {}
    env = stack.inspect(cid)["Config"]["Env"]
    _expect(f"DUALPATH_NATS_URL=nats://{user}:{password}@nats:4222" in env, "nats credentials",
            "the scheduler's DUALPATH_NATS_URL does not carry NATS_USER/NATS_PASSWORD")
    for what, nats_url, want in (("no credentials", "nats://nats:4222", "REFUSED"),
                                 ("wrong password", f"nats://{user}:wrong-{secrets.token_hex(4)}@nats:4222", "REFUSED"),
                                 ("right password", f"nats://{user}:{password}@nats:4222", "CONNECTED")):
        done = stack.exec_in(cid, "python", "-c", _NATS_PROBE, nats_url, namespace)
        _expect(done.stdout.startswith(want), "nats credentials", f"{what}: {done.stdout}{done.stderr[-300:]}")
        seen[what] = done.stdout.strip()
    kv = seen["right password"].removeprefix("CONNECTED ")
    _expect(kv.startswith("KV ") and "bytes" in kv and not kv.endswith(" 0 bytes"), "nats credentials",
            f"the data-plane secret in JetStream KV, with the credentials: {kv}")
    return f"nats: credentials on; without them: {seen['no credentials'][:90]}; with them: {kv}"


def latency(url: str, n: int = 5, max_tokens: int = 16) -> dict[str, float]:
    """Median and min seconds of `n` sequential greedy completions (one warm-up first)."""
    prompt = "Write one sentence about the sea."
    complete(url, prompt, max_tokens)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        complete(url, prompt, max_tokens)
        times.append(time.perf_counter() - t)
    return {"median_s": statistics.median(times), "min_s": min(times), "n": n, "max_tokens": max_tokens}


__all__ = ["CheckFailed", "StackError", "check_completion", "check_streamed_chat", "check_store_reuse",
           "check_metrics", "check_scaled_engines_work", "check_stopping_a_replica_spares_its_siblings",
           "check_killed_engine_restarts", "check_traces", "check_nats_credentials", "latency"]
