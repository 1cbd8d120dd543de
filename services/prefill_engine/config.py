"""Prefill-engine settings."""
from __future__ import annotations

from dataclasses import dataclass

from shared.config import require
from shared.engine.config import EngineConfig


@dataclass(frozen=True)
class PrefillConfig(EngineConfig):
    max_batch_tokens: int = 4096  # prompt tokens computed in one forward
    handoff_timeout_s: float = 30.0  # deadline for pushing KV to the decode engine

    def validate(self) -> None:
        super().validate()
        require(self.max_batch_tokens > 0, "max_batch_tokens", self.max_batch_tokens, "must be > 0")
        require(self.handoff_timeout_s > 0, "handoff_timeout_s", self.handoff_timeout_s, "must be > 0")
