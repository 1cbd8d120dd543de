"""What `make compose-check` asserts about engine containers' lives: killed, scaled, stopped.

Same contract as checks.py: Stack and URL in, a report line out, CheckFailed naming what was seen.
"""
from __future__ import annotations

import json
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from checks import WORK_METRICS, CheckFailed, _expect, _wait, complete, metric_value, metrics_text, prompt_text
from stack import Stack


def check_scaled_engines_work(stack: Stack, url: str, tag: str) -> str:
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
    """Replicas share /dev/shm but not a pid namespace: stopping one removes only its own segments."""
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
    """Kill an engine container's work as a crash would: `process` SIGKILLs the engine inside;
    `docker-kill` sends SIGUSR1, passed on to the entry script (plain `docker kill` is a manual
    stop, which no restart policy restarts)."""
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
    cid = stack.ids(service)[0]
    info = stack.inspect(cid)
    restarts = info["RestartCount"]
    started = info["State"]["StartedAt"]
    flight = StreamInFlight(url)
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
    ended = flight.ended(300)
    return (f"kill: {service} {cid[:12]}: {what}; restarted by its policy (RestartCount {restarts}->{after}), "
            f"healthy in {restarted_s:.0f}s, serving again at {served_s:.0f}s "
            f"({r['usage']['completion_tokens']} tokens); the node's /dev/shm holds {len(shm)} segments: {shm}; "
            f"the stream in flight at the kill: {ended}")


@dataclass(frozen=True)
class StreamEnding:
    """How a streamed completion ended, as its client saw it."""

    text: str = ""
    token_ids: tuple[int, ...] | None = None  # from the last chunk (None: no last chunk)
    error: str = ""  # the error event's message
    lost: str = ""  # the connection broke: the exception
    hung: bool = False  # no byte for the read timeout
    at: float = 0.0  # time.monotonic() at the end


class StreamInFlight:
    """A streamed completion under way at a kill: it must end (every token once, or an error)."""

    N = 300
    READ_TIMEOUT_S = 300.0  # no byte this long: hung

    def __init__(self, url: str, wait_first: bool = True, n: int = N):
        self.url, self.n, self.tokens, self.chunks, self.text, self.error = url, n, 0, 0, "", ""
        self.token_ids: tuple[int, ...] | None = None
        self.lost, self.hung, self.at = "", False, 0.0
        self.first, self.done = threading.Event(), threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        if wait_first:
            _expect(self.first.wait(120), "kill", "a streamed completion's first chunk before the kill")

    def _run(self) -> None:
        body = {"prompt": "the stream in flight at the kill " * 8, "max_tokens": self.n, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
                "return_token_ids": True}
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=self.READ_TIMEOUT_S) as r:
                if r.status_code != 200:
                    self.error = f"HTTP {r.status_code}: {r.read()[:300]!r}"
                    return
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        self._chunk(json.loads(line[6:]))
        except httpx.TimeoutException:
            self.hung = True
        except httpx.HTTPError as exc:
            self.lost = f"{type(exc).__name__}: {exc}"
        finally:
            self.at = time.monotonic()
            self.first.set()
            self.done.set()

    def _chunk(self, chunk: dict) -> None:
        self.error = (chunk.get("error") or {}).get("message", "") or self.error
        choices = chunk.get("choices") or []
        self.chunks += bool(choices)
        self.text += "".join(c.get("text") or "" for c in choices)
        self.tokens = (chunk.get("usage") or {}).get("completion_tokens", self.tokens)
        if "token_ids" in chunk:
            self.token_ids = tuple(chunk["token_ids"])
        self.first.set()

    def ending(self, timeout: float) -> StreamEnding:
        """How it ended (CheckFailed when it has not within `timeout`: hung)."""
        _expect(self.done.wait(timeout), "kill", f"the stream in flight ended ({self.chunks} chunks so far)")
        return StreamEnding(self.text, self.token_ids, self.error, self.lost, self.hung, self.at)

    def ended(self, timeout: float) -> str:
        e = self.ending(timeout)
        _expect(self.tokens >= self.n or e.error or e.lost, "kill", f"{self.tokens} of {self.n} tokens and no error")
        return f"ended with an error event ({e.error or e.lost})" if e.error or e.lost else f"resumed, all {self.n} tokens"


def _try_complete(url: str) -> dict | None:
    try:
        r = httpx.post(url + "/v1/completions", json={"prompt": "Hello again", "max_tokens": 4,
                                                       "temperature": 0, "ignore_eos": True}, timeout=120)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


__all__ = ["check_scaled_engines_work", "check_stopping_a_replica_spares_its_siblings",
           "check_killed_engine_restarts", "kill_engine", "CRASH_SIGNAL", "StreamEnding", "StreamInFlight"]
