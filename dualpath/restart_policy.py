"""When `dualpath up` restarts a process that died: the compose file's `restart: always`.

Pure policy, as Docker's: any exit code, a delay that doubles per restart and resets after
10 s up; here it starts at 0.5 s and is capped at 10 s (Docker: 0.1 s and 60 s).
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
        """Seconds before restarting a process that exited after `uptime_s` up; `previous_s`: the last
        delay (None: never restarted)."""
        if previous_s is None or uptime_s >= self.steady_s:
            return self.first_s
        return min(self.cap_s, previous_s * self.factor)
