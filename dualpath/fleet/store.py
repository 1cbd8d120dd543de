"""The emulated store: which block keys are stored, and the tokens emulated engines generate.

Each emulator process keeps the index and shares new keys (`StoredKeys`); generated ids are a
function of position and the context's first token, so agents build next prompts unasked. Pure.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from shared.kv.hashing import chain_hash

TOKEN_LO, TOKEN_SPAN = 100, 40_000  # ordinary token ids of the scheduler's tokenizer (smollm2: 49,152)


def generated_token(first: int, position: int) -> int:
    """The id an emulated engine generates at absolute `position` of a context starting with `first`."""
    return TOKEN_LO + (position * 2654435761 + first * 40503) % TOKEN_SPAN


def generated_tokens(first: int, start: int, n: int) -> list[int]:
    return [generated_token(first, p) for p in range(start, start + n)]


class StoreIndex:
    def __init__(self) -> None:
        self.keys: set[bytes] = set()
        self.fresh: list[bytes] = []  # added here, not yet shared

    def add(self, keys: Iterable[bytes], share: bool = True) -> None:
        for k in keys:
            if k not in self.keys:
                self.keys.add(k)
                if share:
                    self.fresh.append(k)

    def hit_length(self, keys: Sequence[bytes]) -> int:
        """Leading keys present (a gateway's hit query)."""
        n = 0
        for k in keys:
            if k not in self.keys:
                break
            n += 1
        return n

    def take_fresh(self) -> list[bytes]:
        out, self.fresh = self.fresh, []
        return out


def extend_keys(keys: Sequence[bytes], tokens: Sequence[int], block: int, fingerprint: bytes) -> list[bytes]:
    """Keys of the full blocks of `tokens`, chained on from `keys` (else from the fingerprint)."""
    out, parent = [], keys[-1] if keys else fingerprint
    for i in range(len(tokens) // block):
        parent = chain_hash(parent, tokens[i * block:(i + 1) * block])
        out.append(parent)
    return out
