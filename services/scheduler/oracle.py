"""The oracle mode's index of what would be stored: block keys of finished requests, bounded, LRU.

Pure: no I/O."""
from __future__ import annotations

from collections import OrderedDict


class OracleIndex:
    def __init__(self, max_keys: int = 1_000_000):
        self.max_keys = max_keys
        self._keys: OrderedDict[str, None] = OrderedDict()

    def add(self, keys: list[str]) -> None:
        for k in keys:
            self._keys[k] = None
            self._keys.move_to_end(k)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)

    def hits(self, keys: list[str]) -> int:
        n = 0
        for k in keys:
            if k not in self._keys:
                break
            self._keys.move_to_end(k)
            n += 1
        return n
