"""Read-path bookkeeping of the scheduler: per-node pending storage reads and the path decision.

Owns the scheduler's own count of hit tokens assigned to each node's storage path and
not yet read (the freshest read-queue signal it has: gateway announcements lag by a
heartbeat), and turns the pure policy (`policy.read_path.split_read`) into a decision
with its reason. Pure: no I/O.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from services.scheduler.policy.read_path import split_read


@dataclass(frozen=True)
class PathDecision:
    pe_blocks: int  # hit blocks read on the PE path (the prompt's first ones)
    de_blocks: int  # the rest, read on the DE path
    pe_queue: int  # read-queue tokens of each node when decided
    de_queue: int
    reason: str

    @property
    def path(self) -> str:
        if self.pe_blocks and self.de_blocks:
            return "split"
        return "de" if self.de_blocks else "pe"


@dataclass
class ReadQueues:
    pending: Counter = field(default_factory=Counter)  # node -> hit tokens assigned, not yet read
    held: dict[str, dict[str, int]] = field(default_factory=dict)  # req_id -> {node: tokens}

    def decide(self, mode: str, hit_blocks: int, pe_node: str, de_node: str, block_size: int,
               force: str = "auto") -> PathDecision:
        """`force` (dualpath mode only): "auto" = the policy's split, "pe" / "de" = every hit
        block on that one path (the scheduler's `read_path` setting: tests, experiments)."""
        pq, dq = self.pending[pe_node], self.pending[de_node]
        if hit_blocks <= 0:
            return PathDecision(0, 0, pq, dq, "no hit")
        if mode != "dualpath" or pe_node == de_node:
            why = "basic mode: PE path only" if mode == "basic" else "PE and DE share a node"
            return PathDecision(hit_blocks, 0, pq, dq, why)
        if force == "pe":
            return PathDecision(hit_blocks, 0, pq, dq, "read_path setting: PE path only")
        if force == "de":
            return PathDecision(0, hit_blocks, pq, dq, "read_path setting: DE path only")
        pe_b, de_b = split_read(hit_blocks, pq, dq, block_tokens=block_size)
        why = f"split so both read queues drain together (PE {pq} + {pe_b * block_size}, " \
              f"DE {dq} + {de_b * block_size} tokens)"
        return PathDecision(pe_b, de_b, pq, dq, why)

    def hold(self, req_id: str, d: PathDecision, pe_node: str, de_node: str, block_size: int) -> None:
        self.done(req_id)  # a second hold replaces the first; it never leaks pending tokens
        share = Counter({pe_node: d.pe_blocks * block_size})
        share[de_node] += d.de_blocks * block_size  # the same node twice (PE and DE share it): added, not replaced
        share = {n: t for n, t in share.items() if t}
        for node, tokens in share.items():
            self.pending[node] += tokens
        if share:
            self.held[req_id] = share

    def done(self, req_id: str) -> None:
        """The request's reads are over (its prefill finished, or it ended)."""
        for node, tokens in self.held.pop(req_id, {}).items():
            self.pending[node] -= tokens
            if self.pending[node] <= 0:
                del self.pending[node]


class OracleIndex:
    """Block keys the oracle mode treats as stored (no store is touched): bounded, LRU."""

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
