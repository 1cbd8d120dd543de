"""Agent trajectories: the JSONL format and a generator calibrated to the published trace table (docs/concepts/design.md#agent-traces).

A trajectory is a list of turns (append tokens A_i, generated tokens G_i); the prompt of
turn i+1 is A1,G1,...,Ai,Gi,A(i+1). Shared by `dualpath sim` and `dualpath bench`.
"""
from dualpath.traces.format import Trajectory, TraceFormatError, read_trajectories, write_trajectories
from dualpath.traces.generator import PRESETS, TraceStats, expand_agents, generate, trace_stats, with_tool_calls

__all__ = [
    "PRESETS", "TraceFormatError", "TraceStats", "Trajectory", "expand_agents", "generate",
    "read_trajectories", "trace_stats", "with_tool_calls", "write_trajectories",
]
