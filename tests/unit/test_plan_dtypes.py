"""Planner dtype sizes: bytes per element, FP8 scale overhead, the BF16-kept parts, per-part bytes."""
from __future__ import annotations

import re

import pytest

from dualpath.plan import dtypes
from dualpath.presets import load_arch
from dualpath.presets.counts import ParamCounts

pytestmark = pytest.mark.unit

_FP8_LINEAR = 1.0 + 4.0 / (128 * 128)


def test_unknown_dtype_names_the_choices():
    msg = "unknown dtype 'int4' (choose from fp8, bf16, fp16, fp32)"
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        dtypes.dtype_bytes("int4")


@pytest.mark.parametrize(("dtype", "linear", "raw"), [
    ("fp8", _FP8_LINEAR, 2.0), ("bf16", 2.0, 2.0), ("fp16", 2.0, 2.0), ("fp32", 4.0, 4.0),
])
def test_linear_and_unquantised_bytes(dtype, linear, raw):
    assert dtypes.linear_bytes(dtype) == linear  # scales only for fp8
    assert dtypes.unquantised_bytes(dtype) == raw  # fp8 checkpoints keep these in bf16


@pytest.mark.parametrize("dtype", ["fp8", "fp32"])
def test_part_bytes_scale_each_part_by_its_width(dtype):
    p = ParamCounts(attention=3, dense_mlp=5, routed_experts=7, shared_experts=11, router=13,
                    embeddings=17, norms=19, active_per_token=0)
    lin, raw = dtypes.linear_bytes(dtype), dtypes.unquantised_bytes(dtype)
    assert dtypes.part_bytes(p, dtype) == {
        "attention": 3 * lin, "dense_mlp": 5 * lin, "shared_experts": 11 * lin,
        "routed_experts": 7 * lin, "router": 13 * raw, "embeddings": 17 * raw, "norms": 19 * raw,
    }


def test_attention_weight_bytes():
    arch = load_arch("ds-v3")
    assert dtypes.attention_weight_bytes(arch, "bf16") == arch.params().attention * 2.0
    assert dtypes.attention_weight_bytes(arch, "fp8") == pytest.approx(arch.params().attention * _FP8_LINEAR)
