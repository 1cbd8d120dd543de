"""When `dualpath up` restarts a process that died: the compose file's `restart: always`.

Pure policy: values in, a delay out; no processes, no clocks. `dualpath/supervisor.py` applies
it to the mesh's processes.

`always`, as Docker applies it, restarts a container whatever its exit code (0
included) unless it was stopped on purpose, with a delay that doubles after every restart
and falls back to the first one once the container has stayed up for 10 s. The same here,
with a first delay of 0.5 s (Docker: 0.1 s) and a cap of 10 s (Docker: 60 s), so a laptop mesh
comes back quickly and a crash loop still costs little. Example, a process that dies at once
every time: restarts after 0.5, 1, 2, 4, 8, 10, 10, ... s; one that then stays up 10 s and
dies again waits 0.5 s.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    first_s: float = 0.5  # delay before the first restart (and after a steady run)
    factor: float = 2.0  # each further restart of a process that did not stay up waits this much longer
    cap_s: float = 10.0  # no delay is longer than this
    steady_s: float = 10.0  # up this long: the process counts as recovered, the next delay is first_s

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.cap_s:
            raise ValueError(f"restart delays need 0 < first_s <= cap_s, got first_s={self.first_s} cap_s={self.cap_s}")
        if self.factor < 1:
            raise ValueError(f"restart delay factor must be >= 1, got {self.factor}")

    def next_delay(self, previous_s: float | None, uptime_s: float) -> float:
        """Seconds to wait before restarting a process that just exited after `uptime_s` seconds up;
        `previous_s` is the delay before its last restart (None: it was never restarted)."""
        if previous_s is None or uptime_s >= self.steady_s:
            return self.first_s
        return min(self.cap_s, previous_s * self.factor)
