"""A prompt's block keys packed end to end in one bytes object, read as a sequence of keys."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Iterable, Iterator, overload

from shared.kv.hashing import KEY_BYTES


class KeyRun(Sequence):
    __slots__ = ("blob",)

    def __init__(self, blob: bytes = b""):
        if len(blob) % KEY_BYTES:
            raise ValueError(f"packed block keys must be a multiple of {KEY_BYTES} bytes, got {len(blob)}")
        self.blob = bytes(blob)

    @classmethod
    def pack(cls, keys: Iterable[bytes]) -> "KeyRun":
        keys = list(keys)
        if any(len(k) != KEY_BYTES for k in keys):
            raise ValueError(f"every block key must be {KEY_BYTES} bytes")
        return cls(b"".join(keys))

    def __len__(self) -> int:
        return len(self.blob) // KEY_BYTES

    @overload
    def __getitem__(self, i: int) -> bytes: ...
    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("block key index out of range")
        return self.blob[i * KEY_BYTES:(i + 1) * KEY_BYTES]

    def __iter__(self) -> Iterator[bytes]:
        b = self.blob
        return (b[i:i + KEY_BYTES] for i in range(0, len(b), KEY_BYTES))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KeyRun):
            return self.blob == other.blob
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  (a sequence, compared by value)

    def __repr__(self) -> str:
        return f"KeyRun({len(self)} keys)"
