"""One record per request a prefill engine holds: the work, its state, its stored-KV load, its progress.

Pure state: no I/O, no torch."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from services.prefill_engine.layers import LoadProgress
from services.prefill_engine.life import PeState
from services.prefill_engine.plan_read import PlanLoads
from shared.kv.window import HitWindow
from shared.engine.requests import EngineRequest
from shared.messages.stream import PromptTiers
from shared.messages.work import PrefillWork


@dataclass(eq=False)
class PrefillRequest(EngineRequest):
    work: PrefillWork | None = None  # what the scheduler asked for (its KV plan, its DE)
    loads: PlanLoads = field(default_factory=PlanLoads)  # what its plan loads, in the fetch's terms
    state: PeState | None = None  # where it is (written by PeLife.move alone)
    span: Any = None  # its span at this engine, from intake to release: its moves are its events
    load: LoadProgress | None = None  # its stored KV: the read, then layer by layer (None: nothing to load)
    hit_tokens: int = 0  # prompt tokens served from the store
    staged_hits: int = 0  # ... of them, leading blocks copied from a buffer (prefetched, a kept turn)
    de_read_hits: int = 0  # ... trailing blocks read on the DE path (the rest between: the PE path)
    tiers: PromptTiers | None = None  # where its prompt's KV came from, once prefilled
    computed: int | None = None  # prompt tokens with KV in memory; None = only the hits so far
    de_slots: list[int] = field(default_factory=list)  # DE read path: DE-buffer slots staged for it
    de_hits: list[int] = field(default_factory=list)  # ... block indexes whose stored KV sits in them
    de_held: str = ""  # DE read path: the DE engine whose TM holds slots for it ("" = none)
    adopt: str = ""  # a prefetch it copied straight from its DE's buffer: the push's reservation adopts it
    adopt_blocks: int = 0  # ... its leading blocks (the prompt's first DE-buffer slots, never pushed)
    deadline: float = 0.0  # monotonic time its storage read must report by
    timer: asyncio.Task | None = None  # the deadline task it owns, if any
    window: HitWindow | None = None  # its hits live a few layers at a time in this ring (memory.py)
    push: asyncio.Task | None = None  # its layerwise push to the DE, from its final forward on
    pushed: Any = None  # ... its outcome (PushDone), once over
    computed_at: float = 0.0  # perf_counter when its last layer was computed (hand-off tail metric)
    gone: asyncio.Future | None = None  # resolved when its client left: the hand-off's waits on the DE end on it

    def left(self) -> asyncio.Future:
        """The future its hand-off's waits on the decode side end on (resolved by `leave`)."""
        if self.gone is None:
            self.gone = asyncio.get_running_loop().create_future()
        return self.gone

    def leave(self) -> None:
        fut = self.left()
        if not fut.done():
            fut.set_result(None)

    @property
    def done(self) -> int:
        """Prompt tokens whose KV is in KV memory (stored hits + computed chunks)."""
        return self.hit_tokens if self.computed is None else self.computed

    def prompt_tiers(self, block_size: int) -> PromptTiers:
        """Its prompt's tokens by where their KV came from (shared/tiers.py)."""
        n = len(self.prompt)
        hit = min(self.hit_tokens, n)
        if self.loads.present:  # taken as in KV memory: no tier moved them
            return PromptTiers(computed=n - hit, engine=hit)
        buffer = min(self.staged_hits * block_size, hit)
        de = min(self.de_read_hits * block_size, hit - buffer)
        return PromptTiers(computed=n - hit, buffer=buffer, storage_pe=hit - buffer - de, storage_de=de)

    @property
    def read_pending(self) -> bool:
        """Its storage read is in flight: not reported, nor given up."""
        return self.load is not None and self.load.reading

    def copies_done(self, n_layers: int) -> bool:
        """No storage read or layer copy still targets this request's KV blocks."""
        load = self.load
        if load is None or load.gone:
            return True
        if load.reading:
            return False
        return self.hit_tokens == 0 or load.layers >= n_layers

    def cancel_timer(self) -> None:
        """End the deadline task (unless it is the caller: it ends by returning)."""
        timer, self.timer = self.timer, None
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
