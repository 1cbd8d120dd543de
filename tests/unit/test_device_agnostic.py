"""Nothing in shared/model/ or kernels/ makes a tensor on an implied device.

Every torch factory call there (torch.tensor, zeros, ones, empty, arange, full, rand*, ...)
names its device, so a model and KV cache on CUDA never meet a stray CPU tensor: the CPU
path and the CUDA path run the same code. The few host-side calls by design are listed
with their reason; `*_like` and `Tensor.new_*` follow their argument and need no device.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "linspace", "eye", "rand", "randn",
             "randint", "randperm"}
HOST_BY_DESIGN = {
    "shared/model/random_init.py": "weights are drawn on the host from one CPU generator, so every device gets "
                                   "the same weights for a seed; the loader moves them",
    "kernels/bench.py": "a CPU benchmark of the kernels",
}


def undeviced(path: Path, root: Path = ROOT) -> list[str]:
    """`file:line torch.<factory>` for every factory call without a device= keyword."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and not any(k.arg == "device" for k in node.keywords)):
            out.append(f"{path.relative_to(root)}:{node.lineno} torch.{node.func.attr}")
    return out


def test_every_tensor_factory_in_model_and_kernels_names_its_device():
    files = sorted([*(ROOT / "shared/model").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")])
    found = [hit for f in files if str(f.relative_to(ROOT)) not in HOST_BY_DESIGN for hit in undeviced(f)]
    assert not found, "tensor factories without device= (pass the input's or the cache's device):\n" + "\n".join(found)


def test_the_check_sees_a_factory_without_a_device(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text("import torch\nx = torch.zeros(3)\ny = torch.ones(2, device=x.device)\n")
    assert undeviced(bad, tmp_path) == ["probe.py:2 torch.zeros"]


def test_the_host_side_list_names_existing_files():
    assert all((ROOT / p).is_file() for p in HOST_BY_DESIGN)
