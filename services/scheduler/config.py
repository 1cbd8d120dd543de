"""Scheduler settings."""
from __future__ import annotations

from dataclasses import dataclass

from shared.config import require
from shared.messages.codes import LoadMode
from shared.sched.policy.read_path import NEAR_TIE
from shared.service_config import CommonConfig


@dataclass(frozen=True, repr=False)
class SchedulerConfig(CommonConfig):
    http_host: str = "127.0.0.1"  # the OpenAI-style front door binds here
    http_port: int = 8000  # the OpenAI-style front door's port
    http_fd: int = -1  # a listening socket inherited from a launcher (dualpath up); -1 = bind http_host:http_port
    front_workers: int = 0  # processes serving the HTTP API (tokenize, stream tokens) beside the dispatch core; 0 = the core serves it
    model: str = "smollm2"  # tokenizer source: must name the same model the engines serve
    served_model_name: str = ""  # id clients send as `model`; empty = the engines' model id
    max_body_bytes: int = 4 << 20  # larger bodies get 413
    liveness_timeout_s: float = 3.0  # an engine silent this long is dropped; its requests fail
    assign_timeout_s: float = 120.0  # a request that no engine takes in this time fails (503)
    stall_timeout_s: float = 120.0  # a placed request with no event from its engines this long is resumed (0 = never)
    max_resumes: int = 2  # times a request is resumed elsewhere after an engine/transfer failure
    pe_alpha_tokens: int = 50_000  # Algorithm 1 alpha: a "short" node read queue (~3 s of storage reads)
    pe_beta_tokens: int = 4_096  # Algorithm 1 beta: a prefill engine's token cap (~5 s of prefill on a CPU)
    api_keys: tuple[str, ...] = ()  # Bearer keys required on the API when set (DUALPATH_API_KEYS=k1,k2); /health stays open
    mode: LoadMode = LoadMode.DUALPATH  # how stored KV is loaded when a request names no dualpath_mode (the README glossary: load modes)
    read_path: str = "auto"  # dualpath modes: auto (the mode's rule) | pe | de (every hit on that path: tests)
    read_near_tie: float = NEAR_TIE  # dualpath mode: read queues within this fraction of the longer one tie (fewer tokens served wins)
    prefetch: bool = True  # act on agent hints' tool calls: stage the session's stored KV in a buffer meanwhile
    prefetch_prefer_pe: bool = True  # stage on the prefill side whenever its read ends before the session is due (else: the idler NIC)
    prefetch_margin: float = 2.0  # start a prefetch this many expected read times before the session is due back
    prefetch_grace_s: float = 5.0  # staged blocks wait this long past the expected return (or a tool call's length)
    serve_pending_saves: bool = False  # a finished turn's blocks still in its DE's buffer (saved, maybe unwritten) are the next turn's hits (with traffic_manager pending_hold_s > 0)
    pending_ttl_s: float = 5.0  # how long such blocks wait in the buffer for the next turn
    hint_ttl_s: float = 120.0  # retention of a hinted session's blocks when its hints name no cache_ttl_ms
    journal: bool = True  # record accepted/finished requests on JetStream (off, or no -js on the server: run without)

    def validate(self) -> None:
        require(0 < self.http_port < 65536 or self.http_port == 0, "http_port", self.http_port, "not a port")
        require(self.http_fd >= -1, "http_fd", self.http_fd, "a file descriptor, or -1")
        require(0 <= self.front_workers <= 64, "front_workers", self.front_workers, "0..64")
        require(self.max_body_bytes > 0, "max_body_bytes", self.max_body_bytes, "must be > 0")
        require(self.read_path in ("auto", "pe", "de"), "read_path", self.read_path, "auto, pe or de")
        require(0 <= self.read_near_tie < 1, "read_near_tie", self.read_near_tie, "0 <= x < 1")
        require(self.pe_alpha_tokens >= 0, "pe_alpha_tokens", self.pe_alpha_tokens, "must be >= 0")
        require(self.pe_beta_tokens > 0, "pe_beta_tokens", self.pe_beta_tokens, "must be > 0")
        require(self.prefetch_margin >= 0, "prefetch_margin", self.prefetch_margin, "must be >= 0")
        require(self.prefetch_grace_s >= 0, "prefetch_grace_s", self.prefetch_grace_s, "must be >= 0")
        require(self.pending_ttl_s > 0, "pending_ttl_s", self.pending_ttl_s, "must be > 0")
        require(self.hint_ttl_s >= 0, "hint_ttl_s", self.hint_ttl_s, "must be >= 0")
        require(self.liveness_timeout_s > 0, "liveness_timeout_s", self.liveness_timeout_s, "must be > 0")
        require(self.stall_timeout_s >= 0, "stall_timeout_s", self.stall_timeout_s, "must be >= 0 (0 = never)")

    def __repr__(self) -> str:  # never print the API keys
        return f"SchedulerConfig(http={self.http_host}:{self.http_port}, model={self.model}, mode={self.mode}, " \
               f"api_keys={len(self.api_keys)} configured)"
