"""Decode-engine settings."""
from __future__ import annotations

from dataclasses import dataclass

from shared.config import require
from shared.engine.config import EngineConfig


@dataclass(frozen=True)
class DecodeEngineConfig(EngineConfig):
    max_running: int = 64  # sequences in the running batch
    load_timeout_s: float = 30.0  # deadline for the TM's buffer -> KV memory copy

    def validate(self) -> None:
        super().validate()
        require(self.max_running > 0, "max_running", self.max_running, "must be > 0")
