"""The simulated cluster: nodes, engines, groups, their links, and the requests they hold.

Owns topology, links and KV capacity; load figures are dispatch.py's, batches decode.py's and prefill.py's.
"""
from __future__ import annotations

from dualpath.sim.decode import DecodeState
from dualpath.sim.hardware import Hardware
from dualpath.sim.models import SimModel
from dualpath.sim.resources import Link


class Req:
    """One turn of one agent, as it moves through the simulated cluster."""

    __slots__ = ("rid", "agent", "prompt", "hit", "miss", "gen", "t_arrive", "pe", "de",
                 "pe_hit", "de_hit", "reads_left", "ready", "done", "t_first", "t_join", "t_second", "mem")

    def __init__(self, rid: int, agent: int, prompt: int, hit: int, gen: int, t: float) -> None:
        self.rid = rid
        self.agent = agent
        self.prompt = prompt
        self.hit = hit
        self.miss = prompt - hit
        self.gen = gen
        self.t_arrive = t
        self.pe: Engine | None = None  # set by the dispatcher, with de, at once
        self.de: Engine | None = None
        self.pe_hit = 0  # hit tokens read on the PE path
        self.de_hit = 0  # hit tokens read on the DE path
        self.reads_left = -1  # -1: reads not issued yet
        self.ready = False  # hit KV in a DRAM buffer and DE known: can prefill
        self.done = 0  # miss tokens computed so far
        self.t_first = 0.0
        self.t_join = 0.0
        self.t_second = 0.0  # when the DE's first step puts out the second token
        self.mem = prompt + gen  # KV tokens the DE holds at the end


class Node:
    __slots__ = ("nid", "role", "engines", "snic_r", "snic_w", "dram")

    def __init__(self, nid: int, role: str, hw: Hardware) -> None:
        self.nid = nid
        self.role = role
        self.engines: list[Engine] = []
        self.snic_r = Link(f"{role}{nid}.snic_r", hw.snic_bw)
        self.snic_w = Link(f"{role}{nid}.snic_w", hw.snic_bw)
        self.dram = Link(f"{role}{nid}.dram", hw.dram_bw)


class Engine:
    """A PE or DE (one GPU) with its CNIC; its node's links (`snic_r`, `snic_w`, `dram`) hang on it too."""

    __slots__ = ("eid", "node", "group", "unit", "queue", "cap", "snic_r", "snic_w", "dram",
                 "cnic_r", "cnic_w", "attn_s", "decode", "rows")

    def __init__(self, eid: int, node: Node, hw: Hardware) -> None:
        self.eid = eid
        self.node = node
        self.snic_r, self.snic_w, self.dram = node.snic_r, node.snic_w, node.dram
        self.group: Group | None = None
        self.unit: StepUnit | None = None  # PE: the step unit it computes in
        self.queue: list[Req] = []  # PE: assigned requests not yet prefilled (FIFO)
        self.cap = 0  # DE: KV memory in tokens
        self.cnic_r = Link(f"e{eid}.cnic_r", hw.cnic_bw)
        self.cnic_w = Link(f"e{eid}.cnic_w", hw.cnic_bw)
        self.attn_s = 0.0  # PE: total attention time
        self.decode: DecodeState[Req] | None = None
        self.rows: list[tuple[tuple[Link, int, int, int], ...]] = []  # per stage side: its links (prefill.bind_stages)


class Group:
    """Engines that pull together; only its leader talks to the scheduler."""

    __slots__ = ("gid", "role", "engines")

    def __init__(self, gid: int, role: str, engines: list[Engine]) -> None:
        self.gid = gid
        self.role = role
        self.engines = engines


class StepUnit:
    """Engines that run forward steps together: a prefill EP domain's PEs, or a single PE."""

    __slots__ = ("engines", "busy", "busy_s", "compute_s", "batch", "step_s", "t_start", "lanes")

    def __init__(self, engines: list[Engine]) -> None:
        self.engines = engines
        self.busy = False
        self.busy_s = 0.0  # seconds spent in forward steps
        self.compute_s = 0.0  # of them, the steps' compute and collectives (not waiting on a layerwise load)
        self.batch: list = []
        self.step_s = 0.0
        self.t_start = 0.0
        self.lanes = False  # its CNICs carry a step's model traffic now


class Cluster:
    def __init__(self, P: int, D: int, hw: Hardware, model: SimModel, group_nodes: int = 1,
                 pe_ep_nodes: int = 1, traffic: float = 1.0) -> None:
        if P < 1 or D < 1:
            raise ValueError(f"need at least one prefill and one decode node, got {P}P{D}D")
        self.hw = hw
        self.pe_nodes = [Node(i, "p", hw) for i in range(P)]
        self.de_nodes = [Node(P + i, "d", hw) for i in range(D)]
        self.engines: list[Engine] = []
        for node in self.pe_nodes + self.de_nodes:
            for _ in range(hw.gpus):
                e = Engine(len(self.engines), node, hw)
                node.engines.append(e)
                self.engines.append(e)
        self.pes = [e for n in self.pe_nodes for e in n.engines]
        self.des = [e for n in self.de_nodes for e in n.engines]
        cap = model.kv_capacity_tokens()
        for e in self.des:
            e.cap = cap
            e.decode = DecodeState(model, (e.cnic_r, e.cnic_w), traffic)
        self.pe_groups = self._groups(self.pe_nodes, "p", group_nodes, 0)
        self.de_groups = self._groups(self.de_nodes, "d", group_nodes, len(self.pe_groups))
        if model.moe:
            per = max(1, min(pe_ep_nodes, P))
            self.units = [StepUnit([e for n in self.pe_nodes[i:i + per] for e in n.engines])
                          for i in range(0, P, per)]
        else:
            self.units = [StepUnit([e]) for e in self.pes]
        for u in self.units:
            for e in u.engines:
                e.unit = u

    @staticmethod
    def _groups(nodes: list[Node], role: str, per: int, first: int) -> list[Group]:
        out: list[Group] = []
        for i in range(0, len(nodes), per):
            engines = [e for n in nodes[i:i + per] for e in n.engines]
            g = Group(first + len(out), role, engines)
            for e in engines:
                e.group = g
            out.append(g)
        return out

    @property
    def nodes(self) -> list[Node]:
        return self.pe_nodes + self.de_nodes

    def links(self) -> list[Link]:
        out = [link for n in self.nodes for link in (n.snic_r, n.snic_w, n.dram)]
        return out + [link for e in self.engines for link in (e.cnic_r, e.cnic_w)]
