"""Engine timings for the fleet emulator, from the simulator's compute model (dualpath.sim.models).

Owns the few numbers an emulated engine waits for: a prefill forward (the policy's attention
model plus the linear layers per new token), a storage read of hit KV through a node's storage
NIC, the PD transfer of a prompt's KV over one compute NIC, the decode step of a batch (HBM-bound
over weights and KV, plus the step overhead), and a decode engine's KV capacity. Pure: the
callers sleep.

Example (DeepSeek-V3.2 660B on H800 nodes, 768 decode GPUs): a turn with 32,000 cached and 429
new tokens prefills in ~61 ms; reading its 1.4 GB of hit KV takes ~31 ms of a node's SNIC; a
decode step of 16 sequences of 33K context takes ~29 ms.
"""
from __future__ import annotations

from dataclasses import dataclass

from dualpath.sim.hardware import Hardware, load_hardware
from dualpath.sim.models import SimModel, build_model
from shared.sched.policy import AttentionModel


@dataclass(frozen=True)
class FleetTiming:
    model: SimModel
    hw: Hardware
    ep_gpus: int  # decode GPUs sharing the experts (the simulator's D x GPUs per node)

    @classmethod
    def build(cls, model: str = "ds-v3.2-660b", hardware: str = "h800", decode_engines: int = 8) -> "FleetTiming":
        hw = load_hardware(hardware)
        return cls(build_model(model, hw), hw, max(1, decode_engines))

    @property
    def attention(self) -> AttentionModel:
        return self.model.attention

    def prefill_s(self, chunks: list[tuple[int, int]]) -> float:
        """One prefill forward over (cached, new) chunks: attention + linear layers."""
        new = sum(b for _, b in chunks)
        return self.attention.batch_time(chunks) + new * self.model.linear_s_per_token

    def read_s(self, tokens: int) -> float:
        """Hit KV of `tokens` read through one node's storage NIC(s)."""
        return tokens * self.model.kv_bytes / self.hw.snic_bw

    def transfer_s(self, tokens: int) -> float:
        """A prompt's KV from a prefill engine to a decode engine's buffer over one compute NIC."""
        return tokens * self.model.kv_bytes / self.hw.cnic_bw

    def decode_step_s(self, batch: int, ctx_sum: int, capped_sum: int) -> float:
        return self.model.decode_step_s(batch, ctx_sum, capped_sum, self.ep_gpus)

    def capped(self, ctx: int) -> int:
        """Context a sparse-attention step reads for a sequence of `ctx` tokens (all of it when dense)."""
        return min(ctx, self.model.topk) if self.model.topk else ctx

    def kv_capacity_tokens(self) -> int:
        return self.model.kv_capacity_tokens(self.ep_gpus)

    def pe_thresholds(self, hit_ratio: float, alpha_s: float = 3.0, beta_s: float = 5.0) -> tuple[int, int]:
        """Algorithm 1's (alpha, beta) as the simulator sets them: alpha = tokens a node reads from
        storage in `alpha_s`; beta = prompt tokens (hits included) one PE handles in `beta_s`."""
        alpha = int(self.hw.snic_bw / self.model.kv_bytes * alpha_s)
        per_new = self.model.prefill_tokens_per_s(16384, 512)
        return alpha, int(per_new / max(1.0 - hit_ratio, 0.01) * beta_s)

    def turn_s(self, context: int, append: int, gen: int, batch: int = 16) -> float:
        """A rough turn time (read, prefill, transfer, decode): sizes the agent population."""
        step = self.decode_step_s(batch, batch * (context + gen), batch * self.capped(context + gen))
        return (self.read_s(context) + self.prefill_s([(context, append)]) + self.transfer_s(context + append)
                + gen * step)
