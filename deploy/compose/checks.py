"""What `make compose-check` asserts against a running compose stack.

Each check takes the Stack and the published URL, acts as a user would and returns a report
line, or raises CheckFailed with what it saw. Containers' lives are lifecycle.py's.
"""
from __future__ import annotations

import json
import secrets
import statistics
import time

import httpx

from stack import Stack, StackError

LOGPROB_TOLERANCE = 1e-4  # fp32: the same prompt, with and without the store, within this
MESH = ("scheduler", "prefill-engine", "decode-engine", "storage-gateway-prefill", "storage-gateway-decode")
# service -> its /metrics ports inside the container (9101: the traffic-manager beside an engine)
METRICS_PORTS = {"scheduler": (9100,), "prefill-engine": (9100, 9101), "decode-engine": (9100, 9101),
                 "storage-gateway-prefill": (9100,), "storage-gateway-decode": (9100,)}
WANTED_SERVICES = {"scheduler", "prefill_engine", "decode_engine", "traffic_manager"}  # OTel service.name
# Metric names the checks read, all here: each a tuple of names, the first one a service
# exposes counts (room for an old name beside a new one while a rename rolls out).
METRIC_PREFIX = "dualpath_"
WORK_METRICS = {  # a counter that grows when an engine of this kind gets work
    "prefill-engine": ("dualpath_prefill_engine_requests_total",),
    "decode-engine": ("dualpath_decode_engine_tokens_total",),
}
PERSISTED_METRIC = ("dualpath_decode_engine_persisted_blocks_total",)
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


def check_traces(stack: Stack, url: str, otlp_url: str, tag: str) -> str:
    """Each request's spans reach the OTLP endpoint as ONE trace across the services."""
    rids = [complete(url, prompt_text(f"{tag}-trace-{i}", 90), 6)["id"] for i in range(2)]

    def spans() -> list[dict]:
        return httpx.get(otlp_url + "/spans", timeout=30).json()

    def traced(rid: str):
        """The request's trace once whole: every wanted service, every parent span exported."""
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
    """NATS refuses a client without the right credentials; with them, its KV bucket holds the secret."""
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


def _summary(times: list[float], max_tokens: int) -> dict[str, float]:
    return {"median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3), "n": len(times),
            "max_tokens": max_tokens}


def latency(url: str, n: int = 5, max_tokens: int = 16) -> dict[str, float]:
    """Median and min seconds of `n` sequential greedy completions (one warm-up first)."""
    return latency_side_by_side({"": url}, n, max_tokens)[""]


def latency_side_by_side(urls: dict[str, str], n: int = 7, max_tokens: int = 16) -> dict[str, dict]:
    """`n` greedy completions per target, targets taking turns after a warm-up: name -> median, min s."""
    prompt = "Write one sentence about the sea."
    names = list(urls)
    for name in names:
        complete(urls[name], prompt, max_tokens)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(n):
        for name in names if i % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            complete(urls[name], prompt, max_tokens)
            times[name].append(time.perf_counter() - t)
    return {name: _summary(times[name], max_tokens) for name in names}


__all__ = ["CheckFailed", "StackError", "check_completion", "check_streamed_chat", "check_store_reuse",
           "check_metrics", "check_traces", "check_nats_credentials", "latency", "latency_side_by_side"]
