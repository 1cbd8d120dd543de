"""Prefill-engine settings."""
from __future__ import annotations

from dataclasses import dataclass

from shared.config import require
from shared.engine.config import EngineConfig


@dataclass(frozen=True)
class PrefillEngineConfig(EngineConfig):
    max_batch_tokens: int = 4096  # prompt tokens computed in one forward (hard cap)
    compute_quota_s: float = 4.0  # estimated attention time per forward; a longer prompt is chunked (docs/concepts/design.md#batching-inside-a-prefill-engine)
    attn_per_token_s: float = 2.0e-3  # attention-time model: seconds per new token (profiled on this CPU)
    attn_per_pair_s: float = 2.0e-8  # ... per (new token, attended token) pair
    attn_per_batch_s: float = 1.0e-3  # ... once per forward
    handoff_timeout_s: float = 30.0  # hand-off deadline; a layer's load waits this long after its last progress
    layerwise_push_min_s: float = 0.02  # a forward expected shorter pushes its KV whole after its first token (0: always layerwise)
    hit_window_layers: int = 4  # stored hits of a prompt computed in one forward occupy this many layers at once (0: all)

    def validate(self) -> None:
        super().validate()
        require(self.max_batch_tokens > 0, "max_batch_tokens", self.max_batch_tokens, "must be > 0")
        require(self.compute_quota_s > 0, "compute_quota_s", self.compute_quota_s, "must be > 0")
        require(min(self.attn_per_token_s, self.attn_per_pair_s, self.attn_per_batch_s) >= 0,
                "attn_per_*_s", (self.attn_per_token_s, self.attn_per_pair_s), "must be >= 0")
        require(self.handoff_timeout_s > 0, "handoff_timeout_s", self.handoff_timeout_s, "must be > 0")
        require(self.layerwise_push_min_s >= 0, "layerwise_push_min_s", self.layerwise_push_min_s, "must be >= 0")
        require(self.hit_window_layers >= 0, "hit_window_layers", self.hit_window_layers, "must be >= 0")
