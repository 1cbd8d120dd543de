"""Hot ops of the model, each with its plain-torch reference (test oracle + CPU fallback).

No fused kernel yet: every op is plain torch, so it runs on CPU and CUDA tensors alike.
"""
from kernels.decode import decode_attention, decode_attention_batch
from kernels.paged_decode import paged_decode

__all__ = ["decode_attention", "decode_attention_batch", "paged_decode"]
