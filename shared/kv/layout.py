"""The shape of one KV block: its kind (GQA K/V or MLA latent), dims, dtype and Layer Block offsets.

No torch here: dtypes are named by string and sized from a table.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

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


class KVKind(str, Enum):
    """What the two planes of a Layer Block hold."""

    GQA = "gqa"  # K then V of every KV head
    MLA = "mla"  # each token's latent row, first half then second half


# kind -> on-disk code; codes never change meaning, a new kind gets a new code.
KIND_CODES: dict[KVKind, int] = {KVKind.GQA: 1, KVKind.MLA: 2}
KIND_BY_CODE: dict[int, KVKind] = {code: kind for kind, code in KIND_CODES.items()}


class UnknownDtype(ValueError):
    """A dtype name or code that is not in `DTYPES`."""

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


def kind_code(kind: KVKind) -> int:
    return KIND_CODES[KVKind(kind)]


def kind_of_code(code: int) -> KVKind:
    if code not in KIND_BY_CODE:
        raise ValueError(f"unknown KV layout code {code}")
    return KIND_BY_CODE[code]


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Dims of one KV block; `block_size` in tokens. MLA: `n_kv_heads` 1 and `2 * head_dim ==
    latent_rank + rope_dim + index_dim` (build with `KVLayout.mla`); GQA: all three 0."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    block_size: int = 64
    kind: KVKind = KVKind.GQA
    latent_rank: int = 0  # MLA: kv_lora_rank, the width of c_kv
    rope_dim: int = 0  # MLA: qk_rope_head_dim, the shared roped key
    index_dim: int = 0  # V3.2: the lightning indexer's key (0 without one)

    @classmethod
    def mla(cls, n_layers: int, latent_rank: int, rope_dim: int, index_dim: int = 0, dtype: str = "bfloat16",
            block_size: int = 64) -> KVLayout:
        width = latent_rank + rope_dim + index_dim
        return cls(n_layers, 1, width // 2, dtype, block_size, KVKind.MLA, latent_rank, rope_dim, index_dim)

    def __post_init__(self) -> None:
        dtype_code(self.dtype)  # fail early on an unknown dtype
        object.__setattr__(self, "kind", KVKind(self.kind))
        for name in ("n_layers", "n_kv_heads", "head_dim", "block_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"KVLayout.{name} must be > 0")
        split = (self.latent_rank, self.rope_dim, self.index_dim)
        if self.kind is KVKind.GQA and any(split):
            raise ValueError(f"a GQA KVLayout has no latent row split, got {split}")
        if self.kind is KVKind.MLA:
            width = sum(split)
            if min(self.latent_rank, self.rope_dim) <= 0 or self.index_dim < 0:
                raise ValueError(f"an MLA KVLayout needs latent_rank, rope_dim > 0, got {split}")
            if self.n_kv_heads != 1 or 2 * self.head_dim != width:
                raise ValueError(f"an MLA row of {width} values fills planes of (1, {width / 2:g}), "
                                 f"not ({self.n_kv_heads}, {self.head_dim})")

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype][1]

    @property
    def dtype_code(self) -> int:
        return DTYPES[self.dtype][0]

    @property
    def layer_bytes(self) -> int:
        """Bytes of one Layer Block: both planes of one layer, `(2, T, H, D)`."""
        return 2 * self.block_size * self.n_kv_heads * self.head_dim * self.itemsize

    @property
    def payload_bytes(self) -> int:
        return self.n_layers * self.layer_bytes

    def layer_block_range(self, layer: int) -> tuple[int, int]:
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} out of range [0, {self.n_layers})")
        return layer * self.layer_bytes, self.layer_bytes
