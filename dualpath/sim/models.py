"""Compute and memory model of one engine for a model preset on a node type.

Work comes from the architecture, time from the rates each kind of work reaches (`Rates`).
Prefill is linear GEMMs + attention; a decode step a roofline per kernel plus a fixed overhead.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from dualpath.presets import load_arch
from dualpath.sim.collectives import Layout, cnic_bytes_per_token
from dualpath.sim.hardware import Hardware
from shared.sched.policy import AttentionModel

T = 1e12
G = 1e9


@dataclass(frozen=True, slots=True)
class Rates:
    """Achieved rates on one H800 SXM5 (TFLOPS, GB/s)."""

    # FP8 GEMMs in prefill: DeepGEMM README (H800): MoE grouped contiguous layout
    # 1099-1297 TFLOPS, normal GEMMs at M=4096 990-1358 TFLOPS.
    gemm_fp8: float = 1200.0
    # BF16 GEMMs (dense models): no DeepGEMM figure at the time; assumed 2/3 of the BF16 peak.
    gemm_bf16: float = 650.0
    # Sparse MLA prefill (V3.2 top-k, over the latent: 2*h*(576+512) FLOPs per pair and layer):
    # FlashMLA README, sparse prefill forward up to 640 TFLOPS on H800.
    sparse_mla_prefill: float = 640.0
    # Dense attention prefill (MHA form; GQA): FlashAttention-3 paper, up to 740 TFLOPS BF16
    # forward on H100 SXM5; H800 clocks throttle to ~865 of 989 TFLOPS (FlashMLA deep dive),
    # so 740 * 865 / 989.
    dense_attn_prefill: float = 647.0
    # V3.2 lightning indexer (FP8 logits of 64 heads x 128 dims against every earlier key):
    # no published kernel figure; assumed at DeepGEMM's normal FP8 GEMM rate (M=4096, N=2112:
    # 1058 TFLOPS).
    indexer: float = 1000.0
    # Decode attention: FlashMLA README, dense MLA decode 660 TFLOPS compute-bound and
    # 3000 GB/s memory-bound; token-level sparse decode (FP8 KV) 410 TFLOPS.
    mla_decode: float = 660.0
    sparse_mla_decode: float = 410.0
    kv_read: float = 3000.0
    # Decode GEMMs: DeepGEMM README, masked grouped layout (decode MoE) 925-1233 TFLOPS at
    # 1024 rows per group; weight-read bound at small batch: normal GEMMs at M=64-128 read
    # 1509-2668 GB/s.
    gemm_decode: float = 1000.0
    weight_read: float = 2000.0
    # Per decode step: launches, sampling, the scheduler (CUDA graphs); assumed.
    decode_overhead_s: float = 0.002
    # Per prefill forward: launches and batch set-up; assumed.
    prefill_overhead_s: float = 0.004
    # Fixed cost of one EP collective (dispatch or combine) beyond its bytes: DeepEP's
    # low-latency kernels at EP8 and 128 tokens take 77 / 114 us at 98 / 127 GB/s, of which
    # the bytes explain all but ~10 us; assumed 10 us.
    ep_latency_s: float = 10e-6
    # End to end (DeepSeek-V3/R1 Inference System Overview, 2025-02-28: H800 nodes, prefill
    # EP32 over 4 nodes, decode EP144 over 18): 73.7k input tokens/s per node while
    # prefilling, 56.3% of input tokens hitting the KV cache, so 73.7k * 0.437 / 8 = 4.0k
    # computed tokens/s per GPU; 14.8k output tokens/s per node while decoding at 20-22
    # tokens/s per user, so ~88 sequences per GPU at 1/21 s a step. The prompt length is not
    # published: assumed 4K tokens. `end_to_end` turns these into the share of the kernel
    # rates that survives: about 1/3 for prefill, 0.44 for decode. They are a cross-check on
    # the fitted efficiencies (dualpath/sim/efficiency.py), not an input: both are averages
    # over a day of varying load, and that service decodes with multi-token prediction.
    prod_prefill_tok_s_node: float = 73_700.0
    prod_hit: float = 0.563
    prod_decode_tok_s_node: float = 14_800.0
    prod_tpot_s: float = 1 / 21
    prod_ctx: int = 4096
    # What share of the rates above a whole engine reaches (launch gaps, stragglers, imperfect
    # overlap): 1.0 = the kernels' own. The simulator runs with the fitted ones (SimConfig).
    prefill_eff: float = 1.0
    decode_eff: float = 1.0


@dataclass(frozen=True, slots=True)
class SimModel:
    """Everything the simulator needs about a model on one engine (GPU). Times in seconds."""

    name: str
    kv_bytes: float  # stored KV bytes per token, all layers (incl. indexer keys)
    kv_main_bytes: float  # bytes per token read by main attention in decode
    kv_index_bytes: float  # bytes per token read by the indexer (0 if none)
    topk: int  # sparse-attention cap (0 = dense attention)
    moe: bool  # attention DP + EP: a step unit's engines step together
    linear_s_per_token: float  # prefill GEMM time per new token
    pooled_fraction: float  # share of linear time that is routed-expert (EP-pooled) work
    attention: AttentionModel  # prefill attention time (the policy's model)
    prefill_comm_bytes: float  # CNIC bytes per prefilled token (each direction)
    weight_bytes: float  # on one decode engine
    hbm_bytes: float
    # decode step = overhead + max(batch * gemm, weights) + max(attention FLOPs, KV reads)
    d_overhead_s: float
    d_gemm_s_per_token: float
    d_weights_s: float
    d_att_s_per_capped: float  # main attention, per (token, key) pair within the cap
    d_att_s_per_ctx: float  # indexer (or dense attention), per (token, key) pair
    d_kv_s_per_capped: float
    d_kv_s_per_ctx: float
    decode_comm_bytes: float  # CNIC bytes per decoded token (each direction)
    comm_latency_s: float  # fixed part of one step's collectives
    capacity_tokens: int = 0  # KV tokens a decode engine holds, when known (a mesh's blocks)
    pe_weight_bytes: float = 0.0  # on one prefill engine (its EP domain splits the routed experts)

    def kv_capacity_tokens(self) -> int:
        """KV tokens one decode engine can hold (90% of HBM minus weights and 4 GB)."""
        if self.capacity_tokens:
            return self.capacity_tokens
        free = self.hbm_bytes * 0.9 - self.weight_bytes - 4e9
        if free <= 0:
            raise ValueError(f"{self.name}: weights do not fit in HBM")
        return int(free // self.kv_bytes)

    def prefill_free_bytes(self) -> float:
        """HBM one prefill engine has for KV: the decode rule (90% of HBM less weights and 4 GB of
        activations and workspace), its own weights; 0 when the weights do not fit; inf when HBM is unknown."""
        if self.hbm_bytes <= 0:
            return float("inf")
        free = self.hbm_bytes * 0.9 - self.pe_weight_bytes - 4e9
        return free if free > 0 else 0.0

    def prefill_kv_tokens(self, free_bytes: float = 0.0) -> float:
        """KV tokens (all layers) one prefill engine holds in `free_bytes` (0: prefill_free_bytes())."""
        free = free_bytes if free_bytes > 0 else self.prefill_free_bytes()
        return float(free // self.kv_bytes) if free != float("inf") else free

    def decode_compute_s(self, batch: int, ctx_sum: float, capped_sum: float) -> float:
        """One decode step's compute for `ctx_sum` context tokens (`capped_sum`: each capped at top-k)."""
        if batch == 0:
            return 0.0
        main = capped_sum if self.topk else 0.0
        gemm = batch * self.d_gemm_s_per_token
        att = main * self.d_att_s_per_capped + ctx_sum * self.d_att_s_per_ctx
        kv = main * self.d_kv_s_per_capped + ctx_sum * self.d_kv_s_per_ctx
        return self.d_overhead_s + (gemm if gemm > self.d_weights_s else self.d_weights_s) + (att if att > kv else kv)

    def prefill_tokens_per_s(self, cached: int, new: int) -> float:
        """New tokens per second of one engine on requests of this shape."""
        t = self.attention.request_time(cached, new) + new * self.linear_s_per_token
        return new / t


def end_to_end(r: Rates, hw: Hardware) -> tuple[float, float]:
    """(prefill, decode) share of the kernel rates that DeepSeek's V3 service reaches (see Rates)."""
    raw = replace(r, prefill_eff=1.0, decode_eff=1.0)
    v3 = build_model("ds-v3", hw, Layout(4, hw.gpus), Layout(18, hw.gpus), raw)
    hit = int(r.prod_ctx * r.prod_hit)
    new = r.prod_ctx - hit
    per_gpu = r.prod_prefill_tok_s_node * (1 - r.prod_hit) / hw.gpus
    prefill = per_gpu / v3.prefill_tokens_per_s(hit, new)
    batch = r.prod_decode_tok_s_node / hw.gpus * r.prod_tpot_s
    compute = v3.decode_compute_s(round(batch), batch * r.prod_ctx, 0.0) - v3.d_overhead_s
    decode = compute / (r.prod_tpot_s - v3.d_overhead_s)
    return min(prefill, 1.0), min(decode, 1.0)


def build_model(name: str, hw: Hardware, pe: Layout | None = None, de: Layout | None = None,
                rates: Rates | None = None) -> SimModel:
    """SimModel for a preset name or config path on `hw`; `pe` / `de`: the prefill and decode layouts."""
    r = rates or Rates()
    fp, fd = r.prefill_eff, r.decode_eff
    pe = pe or Layout(1, hw.gpus)
    de = de or Layout(1, hw.gpus)
    arch = load_arch(name)
    p = arch.params()
    fp8 = arch.is_mla  # DeepSeek models: FP8 weights, GEMMs and KV; the others BF16
    wb = 1.0 if fp8 else 2.0
    main = arch.kv_bytes_per_token(1 if fp8 else 2)
    index = arch.index_bytes_per_token(1)
    linear = arch.prefill_flops_per_token()
    routed_active = p.routed_experts * arch.experts_per_token / arch.n_routed_experts if arch.is_moe else 0
    weights = _engine_weights(arch, p, wb, de)
    L = arch.num_layers
    if arch.is_mla:  # absorbed form over the latent (FlashMLA's FLOP count): d_k = latent + rope, d_v = latent
        mla_pair = 2.0 * arch.num_heads * (2 * arch.kv_lora_rank + arch.qk_rope_head_dim) * L
    else:
        mla_pair = 2.0 * arch.num_heads * 2 * arch.head_dim * L
    idx_pair = 2.0 * arch.index_n_heads * arch.index_head_dim * L
    sparse = arch.index_topk > 0
    decode_att_rate = (r.sparse_mla_decode if sparse else r.mla_decode) * T
    kv_bw = r.kv_read * G
    return SimModel(
        name=arch.name, kv_bytes=main + index, kv_main_bytes=main, kv_index_bytes=index,
        topk=arch.index_topk, moe=arch.is_moe,
        linear_s_per_token=linear / ((r.gemm_fp8 if fp8 else r.gemm_bf16) * T * fp),
        pooled_fraction=min(2.0 * routed_active / linear, 1.0) if linear else 0.0,
        attention=_attention_model(arch, r, fp),
        prefill_comm_bytes=cnic_bytes_per_token(arch, pe, prefill=True),
        weight_bytes=weights, hbm_bytes=hw.hbm_gb * G, pe_weight_bytes=_engine_weights(arch, p, wb, pe),
        d_overhead_s=r.decode_overhead_s, d_gemm_s_per_token=linear / (r.gemm_decode * T * fd),
        d_weights_s=weights / (r.weight_read * G * fd),
        d_att_s_per_capped=mla_pair / (decode_att_rate * fd) if sparse else 0.0,
        d_att_s_per_ctx=idx_pair / (r.indexer * T * fd) if sparse else mla_pair / (decode_att_rate * fd),
        d_kv_s_per_capped=main / (kv_bw * fd) if sparse else 0.0,
        d_kv_s_per_ctx=index / (kv_bw * fd) if sparse else main / (kv_bw * fd),
        decode_comm_bytes=cnic_bytes_per_token(arch, de, prefill=False),
        comm_latency_s=2 * arch.num_moe_layers * r.ep_latency_s if de.ep_nodes > 1 else 0.0)


def _engine_weights(arch, p, wb: float, lay: Layout) -> float:
    """Weight bytes on one GPU of `lay`: the routed experts split over its EP domain's GPUs, the rest whole."""
    ep = max(1, min(lay.ep_nodes * lay.gpus, arch.n_routed_experts)) if arch.is_moe else 1
    return (p.total - p.routed_experts) * wb + p.routed_experts * wb / ep


def _attention_model(arch, r: Rates, f: float = 1.0) -> AttentionModel:
    """The policy's AttentionModel from the preset's attention FLOPs and the kernel rates (times `f`)."""
    L = arch.num_layers
    if arch.index_topk:
        main = 2.0 * arch.num_heads * (2 * arch.kv_lora_rank + arch.qk_rope_head_dim) * L
        indexer = 2.0 * arch.index_n_heads * arch.index_head_dim * L
        return AttentionModel(per_pair=indexer / (r.indexer * T * f),
                              per_capped_pair=main / (r.sparse_mla_prefill * T * f),
                              cap=arch.index_topk, per_batch=r.prefill_overhead_s)
    per_pair = arch.attention_flops(0, 1)  # one query over one key (itself), all layers: MHA form
    return AttentionModel(per_pair=per_pair / (r.dense_attn_prefill * T * f), per_batch=r.prefill_overhead_s)
