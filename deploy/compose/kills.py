"""The kill column of `make compose-check`: every process kind SIGKILLed with a stream in flight.

Per kind (the kinds of `python -m dualpath.bench.chaos`): the stream ends (every token once, or an
error event), the service comes back by its restart policy, the stack serves the next request.
"""
from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from checks import CheckFailed, _expect, _wait
from lifecycle import StreamEnding, StreamInFlight, _try_complete, kill_engine
from stack import Stack, StackError

STREAM_END_S = StreamInFlight.READ_TIMEOUT_S + 30  # past the stream's own read timeout: a hang guard only
TOKENS = 120  # the stream in flight: still under way well past the kill on a loaded CPU


@dataclass(frozen=True)
class Target:
    kind: str  # the name in dualpath.bench.chaos.KINDS
    service: str  # the compose service whose container runs the process
    process: str = ""  # `dualpath service <process>` in it; "": the container's main process (PID 1)

    @property
    def holds_client(self) -> bool:
        """The process holds the client's HTTP connection: its death can only drop it."""
        return self.process == "scheduler"

    def label(self) -> str:
        return f"{self.process or 'main process'} in {self.service}"


TARGETS = (
    Target("scheduler", "scheduler", "scheduler"),
    Target("prefill", "prefill-engine", "prefill-engine"),
    Target("decode", "decode-engine", "decode-engine"),
    Target("tm-p", "prefill-engine", "traffic-manager"),  # beside the engine: engine-entry.sh
    Target("tm-d", "decode-engine", "traffic-manager"),
    Target("gateway-p", "storage-gateway-prefill", "storage-gateway"),
    Target("gateway-d", "storage-gateway-decode", "storage-gateway"),
    Target("nats", "nats"),  # nats-server is PID 1 (no init): killed from the host
)


@dataclass
class KillResult:
    target: Target
    outcome: str  # exact | wrong (...) | cut short (...) | error event (...) | lost connection (...) | hung
    passed: bool
    end_s: float = -1.0  # the kill -> the stream's end
    restart_s: float = -1.0  # the kill -> the container running and healthy again
    serve_s: float = -1.0  # the kill -> the next completion served (after the restart)
    restarts: str = ""  # RestartCount before->after
    failure: str = ""  # what the check saw when it failed

    def line(self) -> str:
        t = self.target
        head = f"kill {t.kind:<9} ({t.label()}): {'PASS' if self.passed else 'FAIL'} {self.outcome}"
        body = (f"; stream ended {_s(self.end_s)}, restarted {_s(self.restart_s)} "
                f"(RestartCount {self.restarts or '?'}), serving again {_s(self.serve_s)}")
        return head + body + (f"; {self.failure}" if self.failure else "")

    def figures(self) -> dict:
        return {"service": self.target.service, "process": self.target.process or "pid1", "outcome": self.outcome,
                "passed": self.passed, "end_s": round(self.end_s, 1), "restart_s": round(self.restart_s, 1),
                "serve_s": round(self.serve_s, 1), "restarts": self.restarts}


def _s(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds >= 0 else "-"


def outcome(end: StreamEnding, ref: StreamEnding) -> str:
    """How the stream ended, against the reference (the same request, nothing killed)."""
    if end.hung:
        return "hung"
    if end.error:
        return f"error event ({end.error})"
    if end.lost:
        return f"lost connection ({end.lost})"
    if end.token_ids is None:
        return f"cut short (no last chunk, {len(end.text)} characters, no error)"
    if end.token_ids == ref.token_ids and end.text == ref.text:
        return "exact"
    differ = sum(a != b for a, b in zip(end.token_ids, ref.token_ids or ()))
    return f"wrong ({len(end.token_ids)} tokens, want {len(ref.token_ids or ())}; {differ} differ)"


def acceptable(what: str, target: Target) -> bool:
    """Every token once, or an error event; a dropped connection only from the process that held it."""
    return what == "exact" or what.startswith("error event") or (
        target.holds_client and what.startswith("lost connection"))


def api_url(stack: Stack) -> str:
    """The scheduler's published URL: a restarted container may get another ephemeral host port."""
    return f"http://127.0.0.1:{stack.port('scheduler', 8000)}"


def kill(stack: Stack, cid: str, target: Target) -> str:
    if target.process:
        return kill_engine(stack, cid, target.process, "process")
    pid = stack.inspect(cid)["State"]["Pid"]  # PID 1 ignores SIGKILL from its own namespace: kill from the host
    try:
        os.kill(pid, signal.SIGKILL)
    except PermissionError as exc:
        raise CheckFailed("kill", f"SIGKILL host pid {pid} of {target.service}: {exc} (needs root)") from None
    return f"main process (host pid {pid}) SIGKILLed"


def _wait_restarted(stack: Stack, cid: str, started: str, timeout: float = 300) -> None:
    def back() -> bool:
        s = stack.inspect(cid)["State"]
        return s["StartedAt"] != started and s["Running"] and (s.get("Health") or {}).get("Status") == "healthy"

    try:
        _wait(back, "kill", f"{cid[:12]} restarted by its policy and healthy", timeout, 0.5)
    except CheckFailed as exc:
        s = stack.inspect(cid)
        raise CheckFailed("kill", f"{exc.seen}; {s['State']['Status']}, exit code {s['State']['ExitCode']}, "
                                  f"RestartCount {s['RestartCount']}") from None


def _served(stack: Stack) -> bool:
    try:
        return _try_complete(api_url(stack)) is not None
    except StackError:  # no published port yet
        return False


def check_kill(stack: Stack, target: Target, ref: StreamEnding) -> KillResult:
    """SIGKILL `target` with a stream in flight; the stream's end, the restart, the next completion."""
    r = KillResult(target, "not finished", False)
    try:
        _kill_and_watch(stack, target, ref, r)
    except (CheckFailed, StackError) as exc:
        r.passed, r.failure = False, str(exc)[:600]
    return r


def _kill_and_watch(stack: Stack, target: Target, ref: StreamEnding, r: KillResult) -> None:
    stack.wait_healthy(300)
    cid = stack.ids(target.service)[0]
    before = stack.inspect(cid)
    flight = StreamInFlight(api_url(stack), n=TOKENS)
    t0 = time.monotonic()
    kill(stack, cid, target)
    with ThreadPoolExecutor(1) as pool:  # the restart and the stream's end, timed side by side
        back = pool.submit(_comeback, stack, cid, before["State"]["StartedAt"], t0)
        end = flight.ending(STREAM_END_S)
        r.end_s, r.outcome = end.at - t0, outcome(end, ref)
        r.passed = acceptable(r.outcome, target)
        r.restart_s, r.serve_s = back.result()
    after = stack.inspect(cid)["RestartCount"]
    r.restarts = f"{before['RestartCount']}->{after}"
    _expect(after > before["RestartCount"], "kill", f"RestartCount {r.restarts}")


def _comeback(stack: Stack, cid: str, started: str, t0: float) -> tuple[float, float]:
    """Seconds from the kill to the container healthy again, and to the next completion served after that."""
    _wait_restarted(stack, cid, started)
    restart_s = time.monotonic() - t0
    _wait(lambda: _served(stack), "kill", "a completion after the restart", 180, 0.5)
    return restart_s, time.monotonic() - t0


def reference(stack: Stack) -> StreamEnding:
    """The column's request once with nothing killed: the tokens a stream must end with."""
    end = StreamInFlight(api_url(stack), wait_first=False, n=TOKENS).ending(STREAM_END_S)
    _expect(end.token_ids is not None and len(end.token_ids) == TOKENS and not (end.error or end.lost),
            "kill column", f"the reference stream: {outcome(end, end)}, {len(end.token_ids or ())} tokens")
    return end


def kill_column(stack: Stack, log=print, targets: tuple[Target, ...] = TARGETS) -> list[KillResult]:
    """Every target in turn (a failed one is recorded and the next one still runs)."""
    ref = reference(stack)
    out = []
    for target in targets:
        r = check_kill(stack, target, ref)
        out.append(r)
        log(r.line())
    return out


def figures(results: list[KillResult]) -> dict:
    return {r.target.kind: r.figures() for r in results}


__all__ = ["TARGETS", "Target", "KillResult", "outcome", "acceptable", "check_kill", "kill_column", "figures",
           "api_url", "reference"]
