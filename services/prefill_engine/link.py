"""How the prefill engine's collaborators (fetch, hand-off) reach the mesh: bus, subject names, engine id, spawn.

`spawn` is only for work whose end decides nothing about the request."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from shared.bus import Bus
from shared.messages.subjects import Subjects


@dataclass(frozen=True)
class PeLink:
    bus: Bus
    subjects: Subjects
    engine: str  # this engine's id
    spawn: Callable[..., asyncio.Task]  # spawn(coro, name=...): a supervised task (Service.spawn)
