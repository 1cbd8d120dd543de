"""Engine timings for the fleet emulator, from the simulator's compute model.

Prefill forward, storage read, PD transfer, decode step and KV capacity. Pure: the callers sleep.
"""
from __future__ import annotations

from dataclasses import dataclass

from dualpath.sim.collectives import Layout
from dualpath.sim.hardware import Hardware, load_hardware
from dualpath.sim.models import SimModel, build_model
from shared.sched.policy import AttentionModel

DE_EP_NODES = 4  # nodes of one decode EP domain (the simulator's `de_ep_nodes`)


@dataclass(frozen=True)
class FleetTiming:
    model: SimModel
    hw: Hardware
    ep_gpus: int  # decode GPUs of one EP domain (stepping together)
    scale: float = 1.0  # wall seconds per modelled second (below 1: a faster fleet, for tests)

    @classmethod
    def build(cls, model: str = "ds-v3.2-660b", hardware: str = "h800", decode_engines: int = 8,
              de_ep_nodes: int = DE_EP_NODES, scale: float = 1.0) -> "FleetTiming":
        """`decode_engines` of the whole fleet; EP domains of `de_ep_nodes` nodes (the simulator's default)."""
        if not scale > 0:
            raise ValueError(f"time scale {scale}: must be > 0")
        hw = load_hardware(hardware)
        nodes = max(1, min(de_ep_nodes, max(1, decode_engines) // hw.gpus))
        return cls(build_model(model, hw, de=Layout(nodes, hw.gpus)), hw, nodes * hw.gpus, scale)

    @property
    def attention(self) -> AttentionModel:
        return self.model.attention

    def prefill_s(self, chunks: list[tuple[int, int]]) -> float:
        """One prefill forward over (cached, new) chunks: attention + linear layers."""
        new = sum(b for _, b in chunks)
        return (self.attention.batch_time(chunks) + new * self.model.linear_s_per_token) * self.scale

    def read_s(self, tokens: int) -> float:
        """Hit KV of `tokens` read through one node's storage NIC(s)."""
        return tokens * self.model.kv_bytes / self.hw.snic_bw * self.scale

    def transfer_s(self, tokens: int) -> float:
        """A prompt's KV from a prefill engine to a decode engine's buffer over one compute NIC."""
        return tokens * self.model.kv_bytes / self.hw.cnic_bw * self.scale

    def decode_step_s(self, batch: int, ctx_sum: int, capped_sum: int) -> float:
        """Compute, or the step's collectives over one compute NIC when they take longer."""
        if batch == 0:
            return 0.0
        compute = self.model.decode_compute_s(batch, ctx_sum, capped_sum)
        comm = self.model.comm_latency_s + batch * self.model.decode_comm_bytes / self.hw.cnic_bw
        return (compute if compute > comm else comm) * self.scale

    def capped(self, ctx: int) -> int:
        """Context a sparse-attention step reads for a sequence of `ctx` tokens (all of it when dense)."""
        return min(ctx, self.model.topk) if self.model.topk else ctx

    def kv_capacity_tokens(self) -> int:
        return self.model.kv_capacity_tokens()

    def pe_thresholds(self, hit_ratio: float, alpha_s: float = 3.0, beta_s: float = 5.0) -> tuple[int, int]:
        """Algorithm 1's (alpha, beta): tokens a node reads in `alpha_s`, prompt tokens
        (hits included) a PE handles in `beta_s`."""
        alpha = int(self.hw.snic_bw / self.model.kv_bytes * alpha_s)
        per_new = self.model.prefill_tokens_per_s(16384, 512)
        return alpha, int(per_new / max(1.0 - hit_ratio, 0.01) * beta_s)

    def turn_s(self, context: int, append: int, gen: int, batch: int = 16) -> float:
        """A rough turn time (read, prefill, transfer, decode): sizes the agent population."""
        step = self.decode_step_s(batch, batch * (context + gen), batch * self.capped(context + gen))
        return (self.read_s(context) + self.prefill_s([(context, append)]) + self.transfer_s(context + append)
                + gen * step)
