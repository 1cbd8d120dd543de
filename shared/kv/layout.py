"""The shape of one KV block: dims, dtype, and where each Layer Block sits.

An engine's paged KV cache is one tensor
``(num_blocks, n_layers, 2, block_size, n_kv_heads, head_dim)`` (K then V), so one
block's KV for all layers is contiguous (a Full Block payload) and layer ``l`` of it
is the contiguous sub-range ``[l * layer_bytes, (l + 1) * layer_bytes)`` (a Layer
Block: ``[2, block_size, n_kv_heads, head_dim]``). Concatenating the n Layer Blocks
gives the Full Block, so no layout conversion is ever needed.

Owns: ``KVLayout`` and the dtype name <-> code table used on disk.
Does not own: hashing (``hashing.py``) or the on-disk header (``full_block.py``).
No torch here: dtypes are named by string and sized from a table.
"""

from __future__ import annotations

from dataclasses import dataclass

# dtype name -> (on-disk code, item size in bytes). Codes never change meaning;
# new dtypes get new codes.
DTYPES: dict[str, tuple[int, int]] = {
    "float16": (1, 2),
    "bfloat16": (2, 2),
    "float32": (3, 4),
    "float8_e4m3fn": (4, 1),
    "float8_e5m2": (5, 1),
    "int8": (6, 1),
    "uint8": (7, 1),
}
DTYPE_BY_CODE: dict[int, str] = {code: name for name, (code, _) in DTYPES.items()}


class UnknownDtype(ValueError):
    """A dtype name or code that is not in ``DTYPES``."""

    def __init__(self, dtype: str | int) -> None:
        super().__init__(f"unknown KV dtype {dtype!r}")
        self.dtype = dtype


def dtype_code(name: str) -> int:
    if name not in DTYPES:
        raise UnknownDtype(name)
    return DTYPES[name][0]


def dtype_name(code: int) -> str:
    if code not in DTYPE_BY_CODE:
        raise UnknownDtype(code)
    return DTYPE_BY_CODE[code]


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Dims of one KV block. ``block_size`` is in tokens (default 64)."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    block_size: int = 64

    def __post_init__(self) -> None:
        dtype_code(self.dtype)  # fail early on an unknown dtype
        for name in ("n_layers", "n_kv_heads", "head_dim", "block_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"KVLayout.{name} must be > 0")

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype][1]

    @property
    def dtype_code(self) -> int:
        return DTYPES[self.dtype][0]

    @property
    def layer_bytes(self) -> int:
        """Bytes of one Layer Block: K and V of one layer, ``(2, T, H, D)``."""
        return 2 * self.block_size * self.n_kv_heads * self.head_dim * self.itemsize

    @property
    def payload_bytes(self) -> int:
        """Bytes of one Full Block payload: every layer, layer after layer."""
        return self.n_layers * self.layer_bytes

    def layer_block_range(self, layer: int) -> tuple[int, int]:
        """(offset, length) of layer ``layer``'s Layer Block within the payload."""
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} out of range [0, {self.n_layers})")
        return layer * self.layer_bytes, self.layer_bytes
