"""Discrete-event cluster simulator of the DualPath mesh (`dualpath sim`).

It runs the real scheduling policy over a bandwidth and compute model of P prefill and
D decode nodes; entry points: `engine.run_sim(SimConfig)` and `cli`.
"""
