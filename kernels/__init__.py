"""Hot ops of the model, each with its plain-torch reference (test oracle + CPU fallback).

Modules (one op each):
  attention   attention returning (out, lse); GQA, causal by absolute positions, empty shards
  lse_merge   N-way merge of partial (out, lse); empty shards (lse=-inf) contribute nothing
  decode      split-KV decode attention: `decode_attention(q, k, v)` is the engine API
  paged_decode  a decode batch straight from the paged cache: ragged contexts, one gather, GQA grouped
  paged_mla   absorbed MLA decode straight from the paged latent cache: ragged, one gather, V3.2 masks
  dcp         decode context parallelism: position p on shard p mod N, merged by LSE
  ring        ring (pass-KV) attention with online softmax, simulated or over torch.distributed
  ulysses     sequence <-> head layout switch and Ulysses attention
  partition   contiguous / zigzag / interleave causal partitions and per-rank work
  bench       `python -m kernels.bench`: errors per dtype and split-KV vs single-pass timings
No fused (Triton/CUDA) kernel ships yet: every entry point is plain torch and makes its
tensors on its inputs' device, so the same code runs on CPU and CUDA tensors
(tests/unit/test_device_agnostic.py holds every module to it). Shapes are documented in each module.
"""
from kernels.decode import decode_attention, decode_attention_batch
from kernels.paged_decode import paged_decode

__all__ = ["decode_attention", "decode_attention_batch", "paged_decode"]
