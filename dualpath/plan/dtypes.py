"""Bytes per element for the dtype names the planner accepts, and weight bytes.

FP8 checkpoints count their 128x128 FP32 block scales and the parts kept in BF16.
"""
from __future__ import annotations

from dualpath.presets import ModelArch, ParamCounts

DTYPE_BYTES: dict[str, float] = {"fp8": 1.0, "bf16": 2.0, "fp16": 2.0, "fp32": 4.0}
FP8_BLOCK = 128  # one FP32 scale per FP8_BLOCK x FP8_BLOCK weights
FP8_SCALE_OVERHEAD = 4.0 / (FP8_BLOCK * FP8_BLOCK)


def dtype_bytes(name: str) -> float:
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (choose from {', '.join(DTYPE_BYTES)})")


def linear_bytes(dtype: str) -> float:
    """Bytes per quantisable linear-layer weight, scales included."""
    b = dtype_bytes(dtype)
    return b + FP8_SCALE_OVERHEAD if dtype == "fp8" else b


def unquantised_bytes(dtype: str) -> float:
    """Bytes per weight of the parts an FP8 checkpoint keeps in BF16."""
    return max(dtype_bytes(dtype), 2.0)


def attention_weight_bytes(arch: ModelArch, dtype: str) -> float:
    """All layers' attention projection weights (W_mla for MLA models)."""
    return arch.params().attention * linear_bytes(dtype)


def part_bytes(p: ParamCounts, dtype: str) -> dict[str, float]:
    lin, raw = linear_bytes(dtype), unquantised_bytes(dtype)
    return {
        "attention": p.attention * lin,
        "dense_mlp": p.dense_mlp * lin,
        "shared_experts": p.shared_experts * lin,
        "routed_experts": p.routed_experts * lin,
        "router": p.router * raw,
        "embeddings": p.embeddings * raw,
        "norms": p.norms * raw,
    }
