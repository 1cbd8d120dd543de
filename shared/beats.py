"""Which heartbeats go out: the quiet-beats rule every announcing process shares (services, the fleet emulator)."""
from __future__ import annotations

import msgspec


class Beats:
    """Which heartbeats go out: a changed announcement at once, an unchanged one after `quiet`
    skipped beats (a keepalive every quiet + 1 beats: liveness is judged on silences many beats
    long). A mesh decoding steadily changes nothing in most announcements, and each one costs
    its sender, NATS and every subscriber a wake-up. Pure: the caller compares and publishes."""

    def __init__(self, quiet: int):
        self.quiet, self.last, self.skipped = quiet, None, 0

    def due(self, key: object) -> bool:
        """Whether the announcement whose comparable view is `key` goes out this beat."""
        if key == self.last and self.skipped < self.quiet:
            self.skipped += 1
            return False
        self.last, self.skipped = key, 0
        return True


def engine_beat_key(msg: msgspec.Struct) -> object:
    """An engine's announcement as `Beats` compares it. `tok` grows every decode step and only
    informs (the dispatcher counts tokens in its own ledger): a batch decoding steadily announces
    it with the keepalives, not every beat."""
    return msgspec.structs.replace(msg, tok=0)
