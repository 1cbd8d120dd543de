"""Typed errors a storage read can end with; both mean "treat as a miss"."""

from __future__ import annotations


class BlockUnavailable(Exception):
    """A block could not be served; the prefix ends before it."""

    def __init__(self, key: bytes, reason: str) -> None:
        super().__init__(f"block {key.hex()}: {reason}")
        self.key = key
        self.reason = reason


class BlockMissing(BlockUnavailable):
    """No file for the block (never written, evicted, or removed as corrupt)."""

    def __init__(self, key: bytes) -> None:
        super().__init__(key, "missing")


class BlockCorrupt(BlockUnavailable):
    """The file failed verification; it has been deleted and counted."""
