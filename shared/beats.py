"""Which heartbeats go out: the quiet-beats rule every announcing process shares (services, the fleet emulator)."""
from __future__ import annotations

import msgspec


class Beats:
    """Sends a changed announcement at once, an unchanged one every `quiet` + 1 beats (a keepalive)."""

    def __init__(self, quiet: int):
        self.quiet, self.last, self.skipped = quiet, None, 0

    def due(self, key: object) -> bool:
        if key == self.last and self.skipped < self.quiet:
            self.skipped += 1
            return False
        self.last, self.skipped = key, 0
        return True


def engine_beat_key(msg: msgspec.Struct) -> object:
    """An engine's announcement as `Beats` compares it: without `tok`, which grows every step."""
    return msgspec.structs.replace(msg, tok=0)
