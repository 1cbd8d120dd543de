"""Where each layer of a prompt's blocks lives in a prefill engine's KV memory, and the hit window.

Layer Block (b, l) is number `b * n_layers + l`. With a hit window the first `hits` blocks hold
`layers` layers at a time in a ring: layer l of hit j is ring slot `(l % layers) * hits + j`.
"""
from __future__ import annotations

from dataclasses import dataclass

NO_BLOCK = -1  # block-table entry of a hit block whose layers live in a window's ring


@dataclass(frozen=True, slots=True)
class HitWindow:
    hits: int  # leading blocks of the prompt the ring was cut for (the slot stride)
    ring: tuple[int, ...]  # the whole KV blocks cut into the ring's Layer Blocks
    layers: int  # layers the ring holds at once (1 <= layers < n_layers)
    n_layers: int
    used: int | None = None  # of those, the leading blocks whose KV is really there (None: all `hits`;
    #                          fewer after a short read, whose other blocks got blocks of their own)

    @property
    def in_ring(self) -> int:
        return self.hits if self.used is None else self.used

    def __post_init__(self) -> None:
        if not 0 < self.layers < self.n_layers or self.hits <= 0:
            raise ValueError(f"a window of {self.layers} of {self.n_layers} layers over {self.hits} hits")
        if len(self.ring) * self.n_layers < self.hits * self.layers:
            raise ValueError(f"ring of {len(self.ring)} blocks < {self.hits} hits x {self.layers} layers")

    @staticmethod
    def of(w, n_layers: int) -> "HitWindow | None":
        return None if w is None else HitWindow(w.hits, tuple(w.ring), w.layers, n_layers, w.used)

    @staticmethod
    def ring_blocks(hits: int, layers: int, n_layers: int) -> int:
        """Whole blocks a window of `layers` layers over `hits` hit blocks needs."""
        return -(-hits * layers // n_layers)

    def layer_block(self, j: int, layer: int) -> int:
        k = (layer % self.layers) * self.hits + j
        return self.ring[k // self.n_layers] * self.n_layers + k % self.n_layers

    def released_before(self, layer: int) -> int:
        """The layer whose slots `layer` reuses (-1: none, it is among the first `layers`)."""
        return layer - self.layers


def layer_blocks(blocks: list[int], layer: int, n_layers: int, window: HitWindow | None = None) -> list[int]:
    """Layer Block numbers of every block of a prompt at `layer` (hits in the window's ring)."""
    out = []
    for j, b in enumerate(blocks):
        if window is not None and j < window.in_ring:
            out.append(window.layer_block(j, layer))
        else:
            if b < 0:
                raise ValueError(f"block {j} has no KV block and is not in a window")
            out.append(b * n_layers + layer)
    return out
