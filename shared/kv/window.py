"""Where each layer of a prompt's blocks lives in a prefill engine's KV memory, and the hit window.

KV memory is `num_blocks` blocks of all layers; seen as `num_blocks * n_layers` Layer
Blocks, the Layer Block of (block b, layer l) is number `b * n_layers + l`, at byte offset
that number times the Layer Block's size. A prompt's blocks normally own all their layers
(`layer_block(j, l) = blocks[j] * n_layers + l`). With a hit window, the prompt's first
`hits` blocks (its stored KV) hold only `layers` layers at a time: their Layer Blocks come
from a ring cut out of a few whole blocks (`ring`), and layer l of hit block j sits in ring
slot `(l % layers) * hits + j`. Layer l + layers reuses layer l's slots once layer l has been
computed and handed on, so the hits of a prompt take `ceil(hits * layers / n_layers)` blocks
instead of `hits`. A read that found fewer hits than the ring was cut for keeps the slots
(`used` says how many blocks are really in the ring); the others get blocks of their own.

Example: 30 layers, 6 hits, a window of 5 layers: the ring is 1 block (30 Layer Blocks =
5 layers x 6 hits); layer 7 of hit 2 is ring slot (7 % 5) * 6 + 2 = 14, Layer Block
ring[0] * 30 + 14. Pure: the prefill engine (tables), its traffic-manager (where loads land
and pushes start) and the model (per-layer block tables) all map with this one class.
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
        """Leading blocks read through the ring."""
        return self.hits if self.used is None else self.used

    def __post_init__(self) -> None:
        if not 0 < self.layers < self.n_layers or self.hits <= 0:
            raise ValueError(f"a window of {self.layers} of {self.n_layers} layers over {self.hits} hits")
        if len(self.ring) * self.n_layers < self.hits * self.layers:
            raise ValueError(f"ring of {len(self.ring)} blocks < {self.hits} hits x {self.layers} layers")

    @staticmethod
    def of(w, n_layers: int) -> "HitWindow | None":
        """From a message's window (a `KVWindow`: hits, ring, layers, used), or None for none."""
        return None if w is None else HitWindow(w.hits, tuple(w.ring), w.layers, n_layers, w.used)

    @staticmethod
    def ring_blocks(hits: int, layers: int, n_layers: int) -> int:
        """Whole blocks a window of `layers` layers over `hits` hit blocks needs."""
        return -(-hits * layers // n_layers)

    def layer_block(self, j: int, layer: int) -> int:
        """Layer Block number of hit block `j` at `layer`."""
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
