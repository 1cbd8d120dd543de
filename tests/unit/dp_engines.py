"""The engines around the in-process mesh (dp_mesh.py), without a model: a prefill engine service
with its real intake, states, stored-KV fetch and hand-off (`Fetcher`, `Handoff`; a test says when
its forward computed each layer), and a decode engine service with its real admission, batch
bookkeeping and persister (a test hands it each sampled token). What one prompt's turn moves and
saves is then the code's."""
from __future__ import annotations

import time
from types import SimpleNamespace

from services.decode_engine.app import DecodeEngineService
from services.decode_engine.config import DecodeEngineConfig
from services.decode_engine.persist import Persister
from services.decode_engine.running import DecodeRequest, RunningSeq
from services.prefill_engine.config import PrefillEngineConfig
from services.prefill_engine.life import PeState
from services.prefill_engine.record import PrefillRequest
from shared.engine.store_layout import prompt_keys
from shared.kv.allocator import SlotAllocator
from shared.messages.endpoints import EP
from shared.messages.traffic_manager import LayersComputed
from shared.messages.work import Ack, DecodeAdmit, PrefillWork, Sampling
from shared.sched.plan import PlanEnds, PlanInput, dualpath_split, prompt_blocks
from tests.unit.dp_mesh import BS, DE, DE_NODE, HUGE, LAYERS, LAYOUT, PE, PE_NODE, SLOTS, SUBJECTS, Mesh, Tasks
from tests.unit.pe_util import bare_prefill, errors, finish_forward, intake
from tests.unit.tm_util import Reply

PROMPT = list(range(100, 100 + 4 * BS + 5))  # four full blocks and five tokens: five KV blocks
KEYS = prompt_keys(LAYOUT, PROMPT)  # the store keys of its full blocks, each chained on the one before


def work(hits: int, pe_blocks: int, max_tokens: int = 64) -> PrefillWork:
    """PROMPT's assignment: `hits` leading blocks stored, [0, pe_blocks) of them read on the PE path."""
    plan = dualpath_split(PlanInput(prompt_blocks(len(PROMPT), BS), min(hits, (len(PROMPT) - 1) // BS), hits,
                                    PlanEnds(PE, PE_NODE, DE, DE_NODE), pe_blocks))
    return PrefillWork("r#0", PROMPT, Sampling(max_tokens=max_tokens), DE, "out", block_keys=KEYS, plan=plan)


class Prefill:
    """The prefill engine `pe0`: its service (KV memory of block ids only), fetching and handing off."""

    def __init__(self, mesh: Mesh, tasks: Tasks):
        self.mesh, self.tasks = mesh, tasks
        self.kv = SimpleNamespace(block_size=BS, alloc=SlotAllocator(SLOTS), blocks_for=lambda n: -(-n // BS))
        cfg = PrefillEngineConfig(block_size=BS, handoff_timeout_s=HUGE, hit_window_layers=0, node=PE_NODE,
                                  engine=PE, namespace=SUBJECTS.ns)
        self.svc = bare_prefill(mesh, self.kv, LAYOUT, cfg, spawn=tasks)
        self.svc.free_blocks = lambda req: self.kv.alloc.release(req.req_id)  # its block ids stay: what moved where
        mesh.on_progress = lambda msg: self.svc._on_loaded(msg, None)

    @property
    def failed(self) -> list[tuple[str, object, str]]:
        return [(m.req_id, m.code, m.error) for m in errors(self.mesh.heard)]

    async def load(self, w: PrefillWork) -> PrefillRequest:
        """Intake: the request's KV blocks, and its stored hits fetched, every layer in KV memory."""
        req = await intake(self.svc, w)
        if not req.blocks:  # a miss: its blocks as the prefill loop gives them
            assert self.svc._allocate(req)
        await self.tasks.settle()
        return req

    async def prefill(self, req: PrefillRequest, layerwise: bool, first: int = 7) -> None:
        """Its final forward (the push going on alongside it, layer by layer, when `layerwise`), then
        the hand-off of its first token."""
        self.svc.move(req, PeState.COMPUTING, "its final forward")
        if layerwise:
            self.svc.handoff.start_push(req)
            for layer in range(LAYERS):
                await self.mesh.publish(SUBJECTS.at(EP.TM_COMPUTED, engine=PE), LayersComputed([req.req_id], layer))
        finish_forward(self.svc, req, first)
        await self.tasks.settle()
        assert req.state is PeState.RELEASED and self.svc.life.illegal == 0 and not self.svc.life.held()


class Decode:
    """The decode engine `de0`: its real service, admitting over the mesh, persisting through it."""

    def __init__(self, mesh: Mesh, tasks: Tasks):
        self.tasks = tasks
        svc = self.svc = DecodeEngineService(DecodeEngineConfig(engine=DE, node=DE_NODE, block_size=BS,
                                                                load_timeout_s=HUGE))
        svc.bus = mesh
        svc.loaded = SimpleNamespace(config=SimpleNamespace(max_position=1 << 16, eos_ids=()))
        svc.persister = Persister(LAYOUT, DE_NODE, mesh, SUBJECTS.at(EP.TM_SAVE, engine=DE), HUGE, tasks, svc.metrics,
                                  release=svc._release, on_failure=svc._background_failed)
        mesh.admit = self.admit

    def close(self) -> None:
        self.svc.worker.close()

    async def admit(self, msg: DecodeAdmit) -> Ack:
        d = Reply()
        d.ctx = None
        await self.svc._on_admit(msg, d)
        return d.msg

    def join(self, req_id: str) -> RunningSeq:
        """The admitted request's KV is in KV memory (blocks 20, 21, ...): it joins the batch."""
        req: DecodeRequest = self.svc.held[req_id]
        self.svc._loading(req, list(range(20, 20 + self.svc._limit(req) // BS + 1)))
        seq = self.svc._join(req, req.admit)
        self.svc.running.append(seq)
        return seq

    async def step(self, seq: RunningSeq, token: int) -> None:
        """One decode step sampled `token` for `seq`; its background saves are let run."""
        self.svc._advance(seq, token, None, 1, time.perf_counter())
        await self.tasks.settle()
