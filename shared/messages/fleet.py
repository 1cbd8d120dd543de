"""The fleet emulator's own messages (`{ns}.fleet.*`), which no real service sends or reads.

Each emulator process keeps its own index of the store and shares the keys it adds, batched,
on `{ns}.fleet.stored`; `{ns}.fleet.dump.<name>` asks one process to write what it measured
(the reply is an empty batch from it). dualpath/fleet/ uses them.
"""
from __future__ import annotations

import msgspec


class StoredKeys(msgspec.Struct, array_like=True):
    """Keys an emulator process added to the store since its last share."""

    source: str
    block_keys: list[bytes]
