"""Agent trajectories: the JSONL format and a generator calibrated to the published trace table.

A trajectory is a list of turns (append A_i, generated G_i); turn i+1's prompt is A1,G1,...,Ai,Gi,A(i+1).
"""
from dualpath.traces.format import Trajectory, TraceFormatError, read_trajectories, write_trajectories
from dualpath.traces.generator import PRESETS, TraceStats, expand_agents, generate, trace_stats, with_tool_calls

__all__ = [
    "PRESETS", "TraceFormatError", "TraceStats", "Trajectory", "expand_agents", "generate",
    "read_trajectories", "trace_stats", "with_tool_calls", "write_trajectories",
]
