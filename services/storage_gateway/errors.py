"""Typed errors a storage read can end with; both mean "treat as a miss".

Owns: ``BlockUnavailable`` and its two cases. A caller that catches
``BlockUnavailable`` stops its block chain there and computes the rest.
"""

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
    """The file failed verification (truncated, bad header, bad checksum, wrong
    model); it has been deleted and counted."""
