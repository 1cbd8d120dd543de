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
        return f"{self.ns}.pe.{engine}.work"

    def prefill_loaded(self, engine: str) -> str:
        return f"{self.ns}.pe.{engine}.loaded"

    def decode_admit(self, engine: str) -> str:
        return f"{self.ns}.de.{engine}.admit"

    @property
    def cancel(self) -> str:
        return f"{self.ns}.cancel"

    # stream
    def output(self, scheduler: str) -> str:
        return f"{self.ns}.out.{scheduler}"

    # traffic-manager control, keyed by the engine the TM serves
    def tm(self, engine: str, verb: str) -> str:
        return f"{self.ns}.tm.{engine}.{verb}"

    # storage-gateway control, keyed by node
    def sg(self, node: str, verb: str) -> str:
        return f"{self.ns}.sg.{node}.{verb}"

    def sg_any(self, verb: str) -> str:
        return f"{self.ns}.sg.any.{verb}"
