"""Cross-link class arbitration: when latency work is open anywhere on an endpoint, bulk waits."""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_WEIGHTS = (99, 1)
MAX_HOLD_S = 0.005


class BulkGate:
    """Pure policy: while latency is open, bulk earns wb/wl of each latency byte served and a frame
    held `max_hold` s goes anyway; with none open, bulk always goes."""

    def __init__(self, weights: Sequence[int] = DEFAULT_WEIGHTS, max_hold: float = MAX_HOLD_S) -> None:
        if len(weights) != 2 or any(w <= 0 for w in weights):
            raise ValueError(f"weights must be two positive numbers, got {weights!r}")
        self._ratio = weights[1] / weights[0]
        self.max_hold = max_hold
        self.open_count = 0
        self._credit = 0.0
        self._held_since: float | None = None

    @property
    def busy(self) -> bool:
        return self.open_count > 0

    def open(self) -> None:
        self.open_count += 1

    def close(self) -> None:
        if self.open_count <= 0:
            raise RuntimeError("BulkGate.close without open")
        self.open_count -= 1
        if not self.open_count:
            self._credit = 0.0  # idle latency banks nothing for bulk, and owes nothing
            self._held_since = None

    def served(self, nbytes: int) -> None:
        if self.open_count:
            self._credit += nbytes * self._ratio

    def admit(self, nbytes: int, now: float) -> bool:
        """May a bulk frame of `nbytes` move at time `now`? Consumes credit if so."""
        if not self.open_count:
            self._held_since = None
            return True
        if self._credit >= nbytes:
            self._credit -= nbytes
            self._held_since = None
            return True
        if self._held_since is None:
            self._held_since = now
        if now - self._held_since >= self.max_hold:
            self._held_since = None
            return True
        return False

    def wait_hint(self, now: float) -> float:
        """Seconds until a held bulk frame is admitted by the liveness rule."""
        if self._held_since is None:
            return self.max_hold
        return max(0.0, self.max_hold - (now - self._held_since))
