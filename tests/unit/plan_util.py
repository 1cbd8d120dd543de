"""KV plans for tests: a prompt's leading hits on one engine's PE path, or taken as present."""
from __future__ import annotations

from shared.messages.plan import KvPlan, KvRange, Source


def pe_plan(hits: int, engine: str, node: str = "") -> KvPlan:
    """`hits` leading stored blocks read through `node` (its own, if ""), landed by `engine`'s TM."""
    return KvPlan([KvRange(0, hits, Source.STORE, node=node, engine=engine)] if hits else [], stored=hits)


def present_plan(hits: int) -> KvPlan:
    """The no-I/O bound: `hits` leading blocks taken as in KV memory; nothing pushed or saved."""
    return KvPlan([KvRange(0, hits, Source.PRESENT)] if hits else [], push=False, persist=False, stored=hits)
