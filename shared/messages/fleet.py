"""The fleet emulator's own messages (`{ns}.fleet.*`), which no real service sends or reads."""
from __future__ import annotations

import msgspec


class StoredKeys(msgspec.Struct, array_like=True):
    """Keys an emulator process added to the store since its last share."""

    source: str
    block_keys: list[bytes]
