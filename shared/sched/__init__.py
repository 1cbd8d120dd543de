"""Scheduling shared by the scheduler service, the prefill engine and the simulator.

`policy` holds the paper's rules as pure functions (Algorithm 1, the two-level decode
assignment, the read-path choice, intra-PE batching); `dispatch` holds the queues that
drive them round by round, with the `ledger` of engine loads; `reads` holds the per-node
read-queue bookkeeping and each request's path decision. Everything here is pure (no
I/O, no clock, no nats / torch / asyncio), so the service drives it on wall-clock time
and the simulator on simulated time, through the same code.
"""
