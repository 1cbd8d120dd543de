"""Subject names of every family, in one place. `ns` isolates one mesh (tests use a uuid)."""
from __future__ import annotations


class Subjects:
    def __init__(self, ns: str = "dp"):
        self.ns = ns

    # registry
    @property
    def heartbeat(self) -> str:
        return f"{self.ns}.hb"

    # work
    def prefill_work(self, engine: str) -> str:
        return f"{self.ns}.prefill_engine.{engine}.work"

    def prefill_loaded(self, engine: str) -> str:
        return f"{self.ns}.prefill_engine.{engine}.loaded"

    def decode_admit(self, engine: str) -> str:
        return f"{self.ns}.decode_engine.{engine}.admit"

    def engine_tm(self, engine: str) -> str:
        """An engine's traffic manager -> the engine: it attached (TmAttached)."""
        return f"{self.ns}.engine.{engine}.tm"

    @property
    def cancel(self) -> str:
        return f"{self.ns}.cancel"

    # stream
    def output(self, scheduler: str) -> str:
        return f"{self.ns}.scheduler.{scheduler}.out"

    def front(self, scheduler: str) -> str:
        """A scheduler's front-door workers -> its dispatch core (requests, prefill over, done)."""
        return f"{self.ns}.scheduler.{scheduler}.front"

    def front_ask(self, scheduler: str) -> str:
        """Request/reply: a front-door worker asks its core for /health, /v1/mesh, /metrics."""
        return f"{self.ns}.scheduler.{scheduler}.ask"

    def front_info(self, scheduler: str) -> str:
        """The core -> its front-door workers: the model, its context, the store layout (each heartbeat)."""
        return f"{self.ns}.scheduler.{scheduler}.info"

    def front_workers(self, scheduler: str) -> str:
        """Where a scheduler's front-door workers heartbeat (not the mesh's registry)."""
        return f"{self.ns}.scheduler.{scheduler}.workers"

    @property
    def reads_done(self) -> str:
        """Where traffic-managers tell the schedulers a node's storage reads of a request are over."""
        return f"{self.ns}.scheduler.reads_done"

    # traffic-manager control, keyed by the engine the TM serves
    def tm(self, engine: str, verb: str) -> str:
        return f"{self.ns}.traffic_manager.{engine}.{verb}"

    # storage-gateway control, keyed by node
    def sg(self, node: str, verb: str) -> str:
        return f"{self.ns}.storage_gateway.{node}.{verb}"

    def sg_any(self, verb: str) -> str:
        return f"{self.ns}.storage_gateway.any.{verb}"
