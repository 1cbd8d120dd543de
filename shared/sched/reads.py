"""Read-path bookkeeping: per-node pending storage reads and each request's path decision."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import msgspec

from shared.messages.codes import LoadMode
from shared.sched.ledger import Id
from shared.sched.policy.read_path import NEAR_TIE, ReadPath, choose_path, queues_tie, split_read


class PathDecision(msgspec.Struct, frozen=True):
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
class PendingReads:
    pending: Counter[Id] = field(default_factory=Counter)  # node -> hit tokens assigned, not yet read
    held: dict[Id, dict[Id, int]] = field(default_factory=dict)  # req_id -> {node: tokens}
    touched: set[Id] = field(default_factory=set)  # nodes whose pending count moved since take_touched()
    served: Counter[Id] = field(default_factory=Counter)  # node -> hit tokens ever given it (ties balance on it)
    near_tie: float = NEAR_TIE  # read queues within this fraction of the longer one count as a tie

    def take_touched(self) -> set[Id]:
        out, self.touched = self.touched, set()
        return out

    def decide(self, mode: LoadMode, hit_blocks: int, pe_node: Id, de_node: Id, block_size: int,
               force: str = "auto") -> PathDecision:
        """`force` (dualpath modes): "auto" is the mode's rule, "pe" / "de" every hit block on that path."""
        mode = mode if isinstance(mode, LoadMode) else LoadMode(mode)
        pq, dq = self.pending[pe_node], self.pending[de_node]
        if hit_blocks <= 0:
            return PathDecision(0, 0, pq, dq, "no hit")
        if not mode.both_paths or pe_node == de_node:
            why = "PE and DE share a node" if mode.both_paths else f"{mode} mode: PE path only"
            return PathDecision(hit_blocks, 0, pq, dq, why)
        if force == "pe":
            return PathDecision(hit_blocks, 0, pq, dq, "read_path setting: PE path only")
        if force == "de":
            return PathDecision(0, hit_blocks, pq, dq, "read_path setting: DE path only")
        if mode == LoadMode.DUALPATH:
            ps, ds = self.served[pe_node], self.served[de_node]
            pe_side = choose_path(pq, dq, ps, ds, self.near_tie) is ReadPath.PE
            return PathDecision(hit_blocks if pe_side else 0, 0 if pe_side else hit_blocks, pq, dq,
                                self._why(pq, dq, ps, ds))
        pe_b, de_b = split_read(hit_blocks, pq, dq, block_tokens=block_size)
        why = f"split so both read queues drain together (PE {pq} + {pe_b * block_size}, " \
              f"DE {dq} + {de_b * block_size} tokens)"
        return PathDecision(pe_b, de_b, pq, dq, why)

    def _why(self, pq: int, dq: int, ps: int, ds: int) -> str:
        """The dualpath decision's reason, naming the rule that decided it."""
        if not queues_tie(pq, dq, self.near_tie):
            return f"shorter read queue (PE {pq}, DE {dq} tokens)"
        fewer = f"the node given fewer tokens (PE {ps}, DE {ds})"
        if pq == dq:
            return f"equal read queues: {fewer}"
        return f"near-equal read queues (within {self.near_tie * 100:g}%; PE {pq}, DE {dq} tokens): {fewer}"

    def hold(self, req_id: Id, d: PathDecision, pe_node: Id, de_node: Id, block_size: int) -> None:
        self.done(req_id)  # a second hold replaces the first; it never leaks pending tokens
        share: dict[Id, int] = {}
        if d.pe_blocks:
            share[pe_node] = d.pe_blocks * block_size
        if d.de_blocks:  # the same node twice (PE and DE share it): added, not replaced
            share[de_node] = share.get(de_node, 0) + d.de_blocks * block_size
        for node, tokens in share.items():
            self.pending[node] += tokens
            self.served[node] += tokens
            self.touched.add(node)
        if share:
            self.held[req_id] = share

    def read_done(self, req_id: Id, node: Id) -> None:
        """One node's share of the request's reads is over."""
        share = self.held.get(req_id, {})
        tokens = share.pop(node, 0)
        if not share:
            self.held.pop(req_id, None)
        if tokens:
            self.touched.add(node)
            self.pending[node] -= tokens
            if self.pending[node] <= 0:
                del self.pending[node]

    def done(self, req_id: Id) -> None:
        """The request's reads are over (its prefill finished, or it ended)."""
        for node, tokens in self.held.pop(req_id, {}).items():
            self.touched.add(node)
            self.pending[node] -= tokens
            if self.pending[node] <= 0:
                del self.pending[node]
