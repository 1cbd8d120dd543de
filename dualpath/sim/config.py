"""SimConfig: one frozen dataclass describing a simulation run."""
from __future__ import annotations

from dataclasses import dataclass

from shared.messages.codes import LoadMode, mode_names


@dataclass(frozen=True)
class SimConfig:
    model: str = "ds-v3.2-660b"  # preset name or config.json path
    hardware: str = "h800"
    P: int = 2  # prefill nodes
    D: int = 4  # decode nodes
    trace: str = "gen:64k"  # "gen:<32k|48k|64k>[:<n base>]" or a JSONL path
    agents: int = 500
    scale: float = 1.0  # shrink every trajectory length (keeps the hit ratio)
    seed: int = 0
    aps: float = 0.0  # online: agents per second (Poisson); 0 = offline batch
    duration_s: float = 0.0  # online: simulated seconds; 0 = until all agents finish
    mode: LoadMode = LoadMode.DUALPATH  # how hits are read (shared/messages/codes.py; oracle: no I/O cost)
    assign: str = "policy"  # policy (Algorithm 1 + DE levels) | rr (round-robin)
    pull_s: float = 0.05  # engine groups pull every pull_s
    quota_s: float = 0.3  # intra-PE compute quota (attention time per forward)
    alpha_s: float = 3.0  # alpha = tokens a node reads from storage in alpha_s
    beta_s: float = 5.0  # beta = tokens one PE processes in beta_s
    think_s: float = 0.0  # delay between a turn's end and the next turn
    chunk_align: int = 64  # chunked-prefill sizes are multiples of this
    block_tokens: int = 64  # tokens per KV block: hits are whole blocks, reads split by block
    group_nodes: int = 1  # nodes per engine group
    progress: bool = False

    def __post_init__(self) -> None:
        if self.mode not in mode_names():
            raise ValueError(f"mode must be one of {', '.join(mode_names())}, got {self.mode!r}")
        object.__setattr__(self, "mode", LoadMode(self.mode))
        if self.assign not in ("policy", "rr"):
            raise ValueError(f"assign must be 'policy' or 'rr', got {self.assign!r}")
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {self.block_tokens}")
        if self.agents < 1 or self.P < 1 or self.D < 1:
            raise ValueError("agents, P and D must be >= 1")
