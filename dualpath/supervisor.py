"""Restart a started mesh's processes that exit, after a backoff.

Owns `dualpath up`'s restart bookkeeping: delays from `RestartPolicy`, restarts by `Mesh.restart`.
A process killed on purpose (`Mesh.kill`) is left alone. Single-threaded: the caller calls `tick()`.
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from dualpath.restart_policy import RestartPolicy

if TYPE_CHECKING:
    from dualpath.mesh import Mesh, Proc


@dataclass
class _Track:
    """One process's restart state; `due` is set while it is down and waits for its restart."""
    started_at: float
    delay_s: float | None = None  # the delay before its last restart (None: never restarted)
    due: float | None = None
    restarts: int = 0


class Supervisor:
    def __init__(self, mesh: "Mesh", say: Callable[[str], None], policy: RestartPolicy = RestartPolicy(),
                 clock: Callable[[], float] = time.monotonic):
        self.mesh, self.say, self.policy, self.clock = mesh, say, policy, clock
        now = clock()
        self.tracks: dict[str, _Track] = {p.name: _Track(now) for p in mesh.procs}

    def tick(self) -> None:
        """Notice every process that exited since the last tick; restart those whose delay is over."""
        now = self.clock()
        for proc in list(self.mesh.procs):
            if proc.expected_exit:
                continue
            track = self.tracks.setdefault(proc.name, _Track(now))
            if track.due is None and proc.popen.poll() is not None:
                self._exited(proc, track, now, exit_text(proc.popen.returncode))
            elif track.due is not None and now >= track.due:
                self._start(proc, track, now)

    def restarts(self) -> dict[str, int]:
        """Restarts so far per process name (only those restarted at least once)."""
        return {name: t.restarts for name, t in self.tracks.items() if t.restarts}

    def _exited(self, proc: "Proc", track: _Track, now: float, how: str) -> None:
        uptime = now - track.started_at
        track.delay_s = self.policy.next_delay(track.delay_s, uptime)
        track.due = now + track.delay_s
        self.mesh.keep_logs = True  # a crash's log is worth keeping
        self.say(f"{proc.name} {how} after {uptime:.1f} s up; restart {track.restarts + 1} in "
                 f"{track.delay_s:g} s (log: {proc.log})")

    def _start(self, proc: "Proc", track: _Track, now: float) -> None:
        track.restarts += 1
        track.due = None
        track.started_at = now
        try:
            self.mesh.restart(proc, note=f"restart {track.restarts} by dualpath up")
        except OSError as exc:  # could not even start it (binary gone, no memory): back off and retry
            track.restarts -= 1
            self._exited(proc, track, now, f"could not be started ({exc})")
            return
        self.say(f"{proc.name} restarted (pid {proc.popen.pid}, restart {track.restarts})")


def exit_text(code: int) -> str:
    """`exited with code 1`, or for a signal `exited with code -9 (SIGKILL)`."""
    if code < 0:
        try:
            return f"exited with code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exited with code {code}"
