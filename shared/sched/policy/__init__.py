"""Scheduling policy as pure code (explained in docs/concepts/design.md#scheduling).

Values in, decisions out: no I/O, no clocks, no nats / torch / asyncio. The scheduler
service, the engines and the cluster simulator (`dualpath.sim`) all call these
functions unchanged.

API for the scheduler service
-----------------------------
State it keeps: one global FIFO `deque[Request]` for prefill, one global DE pool
(list), one private `deque[Request]` per DE group. Engines report `EngineReport`
values (seq_e, tok_e, read_q of the engine's node, free KV memory).

- A PE group pulls::

      assignments = assign_prefill(pe_queue, reports, PeThresholds(alpha, beta))

  pops the assigned requests from the head of `pe_queue` (Algorithm 1) and returns
  `[EngineAssignment(rid, engine), ...]` in FIFO order.
- A DE group pulls::

      target = pick_de_group({group: total_tok, ...})          # level 1
      private[target].extend(pool); pool.clear()
      assignments = assign_decode(private[pulling_group], reports)   # level 2

  `assign_decode` removes the placed requests from the private queue (not strictly
  FIFO: a request that fits no engine stays where it was).
- Once a request has both engines::

      path = choose_path(pe_node_read_q, de_node_read_q)               # ReadPath.PE/DE
      pe_blocks, de_blocks = split_read(n_blocks, pe_q, de_q, pe_rate, de_rate)

- A PE forms a forward batch from its ready requests::

      batch = plan_batch([ReadyPrefill(rid, cached, remaining), ...], attn_model, quota)

  returns `[PlannedChunk(rid, cached, bsz), ...]`; the last chunk may be partial (chunked
  prefill, size found by binary search).

Units: tokens for tok_e, read_q, len(r); free memory and a request's `mem` in any one
unit the caller chooses (the simulator uses tokens of KV).
"""
from shared.sched.policy.de_assign import assign_decode, pick_de_group, z_threshold
from shared.sched.policy.intra_pe import AttentionModel, PlannedChunk, ReadyPrefill, balanced_quota, plan_batch
from shared.sched.policy.pe_assign import PeThresholds, assign_prefill, classify
from shared.sched.policy.read_path import ReadPath, choose_path, split_read
from shared.sched.policy.types import EngineAssignment, EngineClass, EngineReport, Request

__all__ = [
    "EngineAssignment", "AttentionModel", "PlannedChunk", "EngineClass", "EngineReport", "PeThresholds",
    "ReadyPrefill", "ReadPath", "Request", "assign_decode", "assign_prefill", "balanced_quota", "choose_path",
    "classify", "pick_de_group", "plan_batch", "split_read", "z_threshold",
]
