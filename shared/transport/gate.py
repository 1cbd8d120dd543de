"""Cross-link class arbitration: when latency work is open anywhere on an endpoint, bulk waits.

Owns `BulkGate`, pure policy (no I/O, no asyncio; the clock is an argument). The tcp
backend gives each class its own socket, so a per-socket DRR cannot rank one class
against the other: bulk bytes on the bulk socket compete with latency bytes for the
event loop, the CPUs and the loopback/NIC. The gate is shared by every link of one
endpoint (initiator and server side) and decides, per bulk frame, whether it may move now.

Rules (weights wl:wb, default 99:1):
  - no latency activity open -> bulk always admitted (work-conserving, no credit banked);
  - latency open -> bulk earns wb/wl of every latency byte served; a bulk frame is
    admitted when the credit covers it (the DRR share, so bulk is never starved by a
    latency backlog);
  - liveness: a bulk frame held for `max_hold` seconds is admitted anyway (a latency
    transfer stuck on a slow remote must not freeze bulk).

Example (99:1, max_hold 5 ms): open(); admit(256K, t=0) -> False; served(1.5M) (credit
15.9K); admit(256K, t=1ms) -> False; close() -> admit(256K, t=1.1ms) -> True.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_WEIGHTS = (99, 1)
MAX_HOLD_S = 0.005


class BulkGate:
    """Counts open latency activities and rations bulk frames against them."""

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
        """Latency bytes moved: bulk earns its weighted share while latency is open."""
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
