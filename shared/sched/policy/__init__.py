"""Scheduling policy as pure functions: values in, decisions out.

Units: tokens for tok_e, read_q and a request's length; free memory and `mem` in one caller-chosen unit.
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
