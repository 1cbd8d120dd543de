"""Decode-engine settings."""
from __future__ import annotations

from dataclasses import dataclass

from shared.config import require
from shared.engine.config import EngineConfig


@dataclass(frozen=True)
class DecodeEngineConfig(EngineConfig):
    max_running: int = 64  # sequences in the running batch
    load_timeout_s: float = 30.0  # deadline for the TM's buffer -> KV memory copy
    admit_wait_s: float = 300.0  # longest wait of an admitted request for free KV blocks (then failed, retryable); 0 = no limit

    def validate(self) -> None:
        super().validate()
        require(self.max_running > 0, "max_running", self.max_running, "must be > 0")
        require(self.admit_wait_s >= 0, "admit_wait_s", self.admit_wait_s, "must be >= 0")
