"""Compute and memory model of one engine for a model preset on a node type.

Derives every number from the architecture (`dualpath.presets.load_arch`): KV bytes per
token, linear FLOPs per token, attention FLOPs per (query, key) pair (sparse-aware),
weight bytes. Prefill runs at an MFU; decode is bound by HBM bandwidth over weights
plus the KV it reads, plus a fixed per-step overhead (MoE all-to-all, launches).
Efficiency factors are the "fitted to profiling" knobs of docs/design.md; defaults are
plausible for H800-class GPUs, not measured.
"""
from __future__ import annotations

from dataclasses import dataclass

from dualpath.presets import load_arch
from dualpath.sim.hardware import Hardware
from shared.sched.policy import AttentionModel


@dataclass(frozen=True, slots=True)
class Efficiency:
    """How close each kind of work gets to peak."""

    linear_mfu: float = 0.45  # prefill GEMMs (FP8 for DS, BF16 for dense models)
    attention_mfu: float = 0.35  # prefill attention kernels
    decode_hbm: float = 0.75  # achieved fraction of HBM bandwidth in decode
    decode_overhead_moe_s: float = 0.012  # per decode step: EP all-to-all, launches
    decode_overhead_dense_s: float = 0.004
    batch_overhead_s: float = 0.004  # per prefill forward


@dataclass(frozen=True, slots=True)
class SimModel:
    """Everything the simulator needs about a model on one engine (GPU)."""

    name: str
    kv_bytes: int  # stored KV bytes per token, all layers (incl. indexer keys)
    kv_main_bytes: int  # bytes per token read by sparse/main attention in decode
    kv_index_bytes: int  # bytes per token read by the indexer (0 if none)
    topk: int  # sparse-attention cap (0 = dense attention)
    moe: bool  # attention DP + EP: a node's engines step together
    linear_s_per_token: float  # prefill GEMM time per new token
    pooled_fraction: float  # share of linear time that is routed-expert (EP-pooled) work
    attention: AttentionModel  # policy attention-time model (seconds)
    weight_bytes_dense: float  # non-routed weights, replicated on every engine
    weight_bytes_routed: float  # routed experts, divided over the EP group
    n_experts: int
    decode_flops_per_token: float
    hbm_bytes: float
    hbm_bw: float  # bytes/s
    eff: Efficiency
    peak_flops: float

    def weights_per_gpu(self, ep_gpus: int) -> float:
        ep = max(1, min(ep_gpus, self.n_experts)) if self.n_experts else 1
        return self.weight_bytes_dense + self.weight_bytes_routed / ep

    def kv_capacity_tokens(self, ep_gpus: int) -> int:
        """KV tokens one decode engine can hold (90% of HBM minus weights and 4 GB)."""
        free = self.hbm_bytes * 0.9 - self.weights_per_gpu(ep_gpus) - 4e9
        if free <= 0:
            raise ValueError(f"{self.name}: weights do not fit in HBM on {ep_gpus} GPUs")
        return int(free // self.kv_bytes)

    def decode_step_s(self, batch: int, ctx_sum: float, capped_sum: float, ep_gpus: int) -> float:
        """One decode step of a batch holding `ctx_sum` context tokens in total."""
        if batch == 0:
            return 0.0
        main = capped_sum if self.topk else ctx_sum
        kv = main * self.kv_main_bytes + ctx_sum * self.kv_index_bytes
        mem = (self.weights_per_gpu(ep_gpus) + kv) / (self.eff.decode_hbm * self.hbm_bw)
        compute = batch * self.decode_flops_per_token / (self.peak_flops * self.eff.linear_mfu)
        over = self.eff.decode_overhead_moe_s if self.moe else self.eff.decode_overhead_dense_s
        return max(mem, compute) + over

    def prefill_tokens_per_s(self, cached: int, new: int) -> float:
        """New tokens per second of one engine on requests of this shape."""
        t = self.attention.request_time(cached, new) + new * self.linear_s_per_token
        return new / t


def build_model(name: str, hw: Hardware, eff: Efficiency | None = None) -> SimModel:
    """SimModel for a preset name or config path on hardware `hw`."""
    eff = eff or Efficiency()
    arch = load_arch(name)
    p = arch.params()
    fp8 = arch.is_mla  # DeepSeek models: FP8 weights and FP8 KV; others BF16 KV, FP8 weights
    kv_dtype = 1 if fp8 else 2
    main = arch.kv_bytes_per_token(kv_dtype)
    index = arch.index_bytes_per_token(1)
    peak = (hw.peak_fp8_tflops if fp8 else hw.peak_bf16_tflops) * 1e12
    linear = arch.prefill_flops_per_token()
    routed_active = p.routed_experts * arch.experts_per_token / arch.n_routed_experts if arch.is_moe else 0
    pooled = 2.0 * routed_active / linear if linear else 0.0
    wb = 1.0  # bytes per weight (FP8 serving for every preset; see report)
    return SimModel(
        name=arch.name, kv_bytes=main + index, kv_main_bytes=main,
        kv_index_bytes=index, topk=arch.index_topk, moe=arch.is_moe,
        linear_s_per_token=linear / (peak * eff.linear_mfu), pooled_fraction=min(pooled, 1.0),
        attention=_attention_model(arch, peak * eff.attention_mfu, eff.batch_overhead_s),
        weight_bytes_dense=(p.total - p.routed_experts) * wb, weight_bytes_routed=p.routed_experts * wb,
        n_experts=arch.n_routed_experts, decode_flops_per_token=linear,
        hbm_bytes=hw.hbm_gb * 1e9, hbm_bw=hw.hbm_tbs * 1e12, eff=eff, peak_flops=peak)


def _attention_model(arch, flops_per_s: float, per_batch: float) -> AttentionModel:
    """Fit the policy's AttentionModel to the preset's attention FLOPs (exact, not sampled)."""
    f = arch.attention_flops
    if arch.index_topk:
        c = arch.index_topk + 10
        indexer = f(c + 1, 1) - f(c, 1)  # per pair, uncapped
        main = f(0, 1) - indexer  # per pair, capped at top-k
        return AttentionModel(per_pair=indexer / flops_per_s, per_capped_pair=main / flops_per_s,
                              cap=arch.index_topk, per_batch=per_batch)
    return AttentionModel(per_pair=f(0, 1) / flops_per_s, per_batch=per_batch)
