"""Discrete-event cluster simulator of the DualPath mesh (`dualpath sim`).

It runs the real scheduling policy (`shared.sched.policy`) over a bandwidth and
compute model of P prefill and D decode nodes: storage NICs, compute NICs, DRAM, and
per-engine compute from a model preset. Entry points: `run_sim(SimConfig)` in
`dualpath.sim.engine`, the CLI in `dualpath.sim.cli`.
"""
