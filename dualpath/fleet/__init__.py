"""A fleet emulator: thousands of emulated engines around one real scheduler and a real NATS.

The benchmark is `python -m dualpath.bench.fleet`.
"""
