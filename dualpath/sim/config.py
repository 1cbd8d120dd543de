"""SimConfig: one frozen dataclass describing a simulation run."""
from __future__ import annotations

from dataclasses import dataclass

from shared.messages.codes import LoadMode, mode_names
from dualpath.sim.efficiency import DECODE_EFF, PREFILL_EFF
from shared.sched.policy.read_path import NEAR_TIE

# The mesh's load modes (LoadMode), plus one the simulator alone models: an SGLang +
# Mooncake-style engine — PE path only, each request's whole stored prompt in HBM before its
# compute starts (no layerwise overlap), round-robin engine choice (no read-queue-aware
# scheduling).
SGLANG = "sglang"
SIM_MODES = (*mode_names(), SGLANG)


def parse_sim_modes(text: str) -> list[str]:
    """`--modes` of the simulator: the mesh's load modes and SGLANG; ValueError naming a bad one."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in SIM_MODES]
    if bad or not names:
        raise ValueError(f"unknown mode {bad[0] if bad else '(none)'} (choose from {', '.join(SIM_MODES)})")
    return [m if m == SGLANG else LoadMode(m) for m in names]


@dataclass(frozen=True)
class SimConfig:
    model: str = "ds-v3.2-660b"  # preset name or config.json path
    hardware: str = "h800"
    P: int = 2  # prefill nodes
    D: int = 4  # decode nodes
    trace: str = "gen:64k"  # "gen:<32k|48k|64k>[:<n base>]" or a JSONL path
    agents: int = 500
    scale: float = 1.0  # shrink every trajectory length (keeps the hit ratio)
    append_scale: float = 1.0  # multiply every turn's append but the first
    seed: int = 0
    aps: float = 0.0  # online: agents per second (Poisson); 0 = offline batch
    duration_s: float = 0.0  # online: simulated seconds; 0 = until all agents finish
    mode: str = LoadMode.DUALPATH  # how hits are read: a LoadMode (oracle: no I/O cost), or SGLANG
    assign: str = "policy"  # policy (Algorithm 1 + DE levels) | rr (round-robin)
    read_near_tie: float = NEAR_TIE  # dualpath: read queues within this fraction of the longer one tie (PendingReads)
    layerwise: bool = True  # load hit KV layer by layer under the compute (False: before it)
    # without layerwise: HBM (GB) a prefill GPU has for its batch's whole KV; 0 = the physical figure
    # (SimModel.prefill_free_bytes: 90% of HBM less its weights and 4 GB)
    pe_free_hbm_gb: float = 0.0
    pull_s: float = 0.05  # engine groups pull every pull_s
    quota_s: float = 0.3  # intra-PE compute quota (attention time per forward)
    attn_balance: float = 0.0  # > 0: a step unit's batches cut to keep attention max/avg within this
    alpha_s: float = 3.0  # alpha = tokens a node reads from storage in alpha_s
    beta_s: float = 5.0  # beta = tokens one PE processes in beta_s
    think_s: float = 0.0  # delay between a turn's end and the next turn
    tool_calls: float = 0.0  # tool calls between turns: the trace's (or generated) durations times this; 0 = none
    hints: str = "off"  # agents that hint their tool calls (prefetch, dualpath/sim/prefetch.py): off | on | mixed
    chunk_align: int = 64  # chunked-prefill sizes are multiples of this
    block_tokens: int = 64  # tokens per KV block: hits are whole blocks, reads split by block
    group_nodes: int = 1  # nodes per engine group
    pe_ep_nodes: int = 2  # nodes of one prefill EP domain (a step unit), at most P
    de_ep_nodes: int = 4  # nodes of one decode EP domain, at most D
    attn_tp: int = 1  # attention TP degree (1 = attention DP, the paper's layout)
    model_traffic: float = 1.0  # scale of the model's collectives on the CNICs (0 = none)
    # share of the kernels' published rates a whole engine reaches (dualpath/sim/efficiency.py: fitted)
    prefill_eff: float = PREFILL_EFF
    decode_eff: float = DECODE_EFF
    # mesh only: CPU seconds a node's engine loses per byte its storage NIC moves (its storage
    # path shares the engine's cores, dualpath/sim/hostcpu.py); 0 = none, as on a real cluster
    kv_cpu_s_per_byte: float = 0.0
    # mesh only: every engine on one host of host_cores cores, the mesh's other processes keeping
    # background_cores of them busy (dualpath/sim/hostcpu.py); 0 = each engine has its own cores
    host_cores: float = 0.0
    background_cores: float = 0.0
    # mesh only, with host_cores: how much longer a prefill / decode engine computes while the other
    # kind computes beside it, as the bench's co-run probe measured (dualpath/bench/corun.py); 1 = none
    host_corun_prefill: float = 1.0
    host_corun_decode: float = 1.0
    # a turn hits only the blocks of earlier turns already written through the storage NIC when
    # it arrives (dualpath/sim/stored.py); False: every earlier full block, at once
    write_lag: bool = False
    # online stop rule (docs/concepts/design.md#published-figures): SLO, windows, steady state
    slo_ttft_s: float = 4.0
    slo_tpot_s: float = 0.050
    window_s: float = 150.0  # TTFT / TPOT are judged over windows of this length
    steady_lag_s: float = 1800.0  # steady: a window's TTFT within steady_tol of the one this long before
    steady_tol: float = 0.05
    progress: bool = False

    def __post_init__(self) -> None:
        if self.mode not in SIM_MODES:
            raise ValueError(f"mode must be one of {', '.join(SIM_MODES)}, got {self.mode!r}")
        if self.mode != SGLANG:
            object.__setattr__(self, "mode", LoadMode(self.mode))
        if self.assign not in ("policy", "rr"):
            raise ValueError(f"assign must be 'policy' or 'rr', got {self.assign!r}")
        if self.hints not in ("off", "on", "mixed"):
            raise ValueError(f"hints must be off, on or mixed, got {self.hints!r}")
        if self.attn_balance != 0 and self.attn_balance < 1:
            raise ValueError(f"attn_balance must be 0 (off) or >= 1, got {self.attn_balance}")
        if not 0 <= self.read_near_tie < 1:
            raise ValueError(f"read_near_tie must be in [0, 1), got {self.read_near_tie}")
        if self.tool_calls < 0:
            raise ValueError(f"tool_calls must be >= 0, got {self.tool_calls}")
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {self.block_tokens}")
        if self.agents < 1 or self.P < 1 or self.D < 1:
            raise ValueError("agents, P and D must be >= 1")
        if self.pe_ep_nodes < 1 or self.de_ep_nodes < 1 or self.attn_tp < 1:
            raise ValueError("pe_ep_nodes, de_ep_nodes and attn_tp must be >= 1")
        if not (0 < self.prefill_eff <= 1 and 0 < self.decode_eff <= 1):
            raise ValueError(f"prefill_eff and decode_eff must be in (0, 1], got {self.prefill_eff}, {self.decode_eff}")
        if self.model_traffic < 0:
            raise ValueError(f"model_traffic must be >= 0, got {self.model_traffic}")
        if self.host_cores < 0 or self.background_cores < 0:
            raise ValueError("host_cores and background_cores must be >= 0")
        if self.host_corun_prefill < 1 or self.host_corun_decode < 1:
            raise ValueError(f"host_corun_prefill and host_corun_decode must be >= 1, got "
                             f"{self.host_corun_prefill}, {self.host_corun_decode}")
        if self.pe_free_hbm_gb < 0:
            raise ValueError(f"pe_free_hbm_gb must be >= 0, got {self.pe_free_hbm_gb}")
        if self.kv_cpu_s_per_byte < 0:
            raise ValueError(f"kv_cpu_s_per_byte must be >= 0, got {self.kv_cpu_s_per_byte}")

    @property
    def reads_on_pe_only(self) -> bool:
        return self.mode in (LoadMode.BASIC, SGLANG)

    @property
    def whole_prompt_first(self) -> bool:
        """Stored KV is in HBM before the request computes (no layerwise overlap)."""
        return self.mode == SGLANG or not self.layerwise

    @property
    def assign_kind(self) -> str:
        return "rr" if self.mode == SGLANG else self.assign
