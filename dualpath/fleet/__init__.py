"""A fleet emulator: thousands of emulated engines around one real scheduler and a real NATS.

`timing` turns the simulator's compute model into engine timings; `store` is the emulated
shared store's index; `prefill` and `decode` are the emulated engines; `group` runs many of
them (with their traffic-managers' and gateways' announcements) in one process; `agents`
drives the scheduler over HTTP; `driver` starts everything and measures. The benchmark is
`python -m dualpath.bench.fleet` (docs/guides/fleet.md).
"""
